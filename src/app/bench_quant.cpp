// `gossamer bench quant`: encode and decode throughput of every codec on one core, in GB/s of fp32
// input, next to memcpy of the same buffer and to the naive LibTorch-ops implementation of the same
// codec, all in one run; then the bits each codec really costs per value. Google Benchmark does the
// timing; this file registers the cases and prints the table.
#include <torch/torch.h>

#include <benchmark/benchmark.h>

#include <cstring>
#include <map>

#include <fmt/format.h>

#include "app/commands.h"
#include "quant/codec.h"
#include "quant/reference.h"

namespace gossamer::app {

namespace {

class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& r : runs) {
      auto it = r.counters.find("bytes_per_second");
      if (it != r.counters.end()) rates[r.benchmark_name()] = it->second.value;
    }
    ConsoleReporter::ReportRuns(runs);
  }
  std::map<std::string, double> rates;
};

}  // namespace

int bench_quant(const BenchArgs& args) {
  // The values, two byte copies, an encoded buffer and the naive rows' temporaries: about 8 copies.
  if (Status st = check_bench_memory(8.0 * 4.0 * static_cast<double>(args.elements), "--elements " + std::to_string(args.elements)); !st.ok()) {
    return report_failure(st);
  }
  torch::set_num_threads(1);  // one core
  const std::int64_t n = args.elements;
  const std::int64_t bytes = n * 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor x = torch::randn({n}, gen);

  std::vector<std::uint8_t> src(static_cast<std::size_t>(bytes)), dst(static_cast<std::size_t>(bytes));
  std::memcpy(src.data(), x.data_ptr<float>(), static_cast<std::size_t>(bytes));
  benchmark::RegisterBenchmark("memcpy", [&](benchmark::State& st) {
    for (auto _ : st) {
      std::memcpy(dst.data(), src.data(), src.size());
      benchmark::DoNotOptimize(dst.data());
      benchmark::ClobberMemory();
    }
    st.SetBytesProcessed(st.iterations() * bytes);
  });
  for (const auto& t : quant::codec_table()) {
    quant::EncodeOptions o;
    o.codec = t.id;
    o.block_size = static_cast<std::uint32_t>(args.block);
    const std::string name(t.name);
    const Bytes payload = quant::encode(x, o);
    benchmark::RegisterBenchmark(("encode/" + name).c_str(), [&x, o, bytes](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(quant::encode(x, o));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    benchmark::RegisterBenchmark(("decode/" + name).c_str(), [payload, bytes](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(quant::decode(payload));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    if (!args.naive) continue;
    const quant::reference::Encoded ref = quant::reference::encode(x, t.id, o.block_size);
    benchmark::RegisterBenchmark(("naive_encode/" + name).c_str(), [&x, id = t.id, block = o.block_size, bytes](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(quant::reference::encode(x, id, block));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    benchmark::RegisterBenchmark(("naive_decode/" + name).c_str(), [ref, id = t.id, block = o.block_size, n, bytes](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(quant::reference::decode(ref, id, block, {n}));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
  }

  std::vector<std::string> argv_store = {"gossamer-bench-quant", "--benchmark_min_time=" + std::to_string(args.min_time)};
  std::vector<char*> argv;
  for (auto& s : argv_store) argv.push_back(s.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();

  auto gbs = [&](const std::string& k) {
    auto it = collector.rates.find(k);
    return it == collector.rates.end() ? std::string("-") : fmt::format("{:.2f}", it->second / 1e9);
  };
  fmt::print("\nquant codecs: {} fp32 values ({} MiB), block {}, fp32 scales, one core; GB/s of fp32 input\n", n, bytes >> 20, args.block);
  fmt::print("memcpy of the same buffer: {} GB/s\n\n", gbs("memcpy"));
  fmt::print("| codec | bits/value | encode | decode | naive encode | naive decode |\n|---|---|---|---|---|---|\n");
  for (const auto& t : quant::codec_table()) {
    quant::EncodeOptions o;
    o.codec = t.id;
    o.block_size = static_cast<std::uint32_t>(args.block);
    const std::string name(t.name);
    fmt::print("| {} | {:.3f} | {} | {} | {} | {} |\n", name, quant::bits_per_value(o), gbs("encode/" + name), gbs("decode/" + name),
               gbs("naive_encode/" + name), gbs("naive_decode/" + name));
  }
  return 0;
}

}  // namespace gossamer::app
