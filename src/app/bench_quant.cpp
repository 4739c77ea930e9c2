// `gossamer bench quant`: encode and decode throughput of every codec on one core, in GB/s of fp32
// input, next to memcpy of the same buffer and to the naive LibTorch-ops implementation of the same
// codec, all in one run; then the bits each codec really costs per value. Google Benchmark does the
// timing; this file registers the cases and prints the table.
#include <torch/cuda.h>
#include <torch/torch.h>

#include <benchmark/benchmark.h>

#include <cstring>
#include <functional>
#include <map>

#include <fmt/format.h>

#include "app/commands.h"
#include "quant/codec.h"
#include "quant/device_encode.h"
#include "quant/reference.h"
#include "train/device.h"

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

// Runs the registered benchmarks for at least `min_time` seconds each: bytes per second by name.
std::map<std::string, double> run_registered(double min_time) {
  std::vector<std::string> argv_store = {"gossamer-bench-quant", "--benchmark_min_time=" + std::to_string(min_time)};
  std::vector<char*> argv;
  for (auto& s : argv_store) argv.push_back(s.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  benchmark::Shutdown();
  return collector.rates;
}

// Each codec's encode and decode (and LibTorch's naive ones with --naive) as benchmarks.
void register_codecs(const BenchArgs& args, const at::Tensor& x, const at::Tensor& on_device, bool gpu, const at::Device& device,
                     const std::function<void()>& wait) {
  const std::int64_t n = args.elements;
  const std::int64_t bytes = n * 4;
  for (const auto& t : quant::codec_table()) {
    quant::EncodeOptions o;
    o.codec = t.id;
    o.block_size = static_cast<std::uint32_t>(args.block);
    const std::string name(t.name);
    const Bytes payload = quant::encode(x, o);
    benchmark::RegisterBenchmark(("encode/" + name).c_str(), [&on_device, o, bytes, gpu](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(quant::encode(gpu ? on_device.to(torch::kCPU) : on_device, o));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    if (gpu && quant::device::covers(o)) {  // encoded where the values are, and only the payload copied
      benchmark::RegisterBenchmark(("device_encode/" + name).c_str(), [&on_device, o, bytes](benchmark::State& st) {
        for (auto _ : st) benchmark::DoNotOptimize(quant::encode(on_device, o, quant::EncodePath::kTensorOps));
        st.SetBytesProcessed(st.iterations() * bytes);
      });
    }
    benchmark::RegisterBenchmark(("decode/" + name).c_str(), [payload, bytes, gpu, wait, d = device](benchmark::State& st) {
      for (auto _ : st) {
        auto y = quant::decode(payload);
        if (gpu && y.ok()) benchmark::DoNotOptimize(y->to(d));
        wait();
        benchmark::DoNotOptimize(y);
      }
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    if (!args.naive) continue;
    const quant::reference::Encoded ref = quant::reference::encode(on_device, t.id, o.block_size);
    benchmark::RegisterBenchmark(("naive_encode/" + name).c_str(), [&on_device, wait, id = t.id, block = o.block_size, bytes](benchmark::State& st) {
      for (auto _ : st) {
        benchmark::DoNotOptimize(quant::reference::encode(on_device, id, block));
        wait();
      }
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    benchmark::RegisterBenchmark(("naive_decode/" + name).c_str(), [ref, wait, id = t.id, block = o.block_size, n, bytes](benchmark::State& st) {
      for (auto _ : st) {
        benchmark::DoNotOptimize(quant::reference::decode(ref, id, block, {n}));
        wait();
      }
      st.SetBytesProcessed(st.iterations() * bytes);
    });
  }

}

}  // namespace

int bench_quant(const BenchArgs& args) {
  // The values, two byte copies, an encoded buffer and the naive rows' temporaries: about 8 copies.
  if (Status st = check_bench_memory(8.0 * 4.0 * static_cast<double>(args.elements), "--elements " + std::to_string(args.elements)); !st.ok()) {
    return report_failure(st);
  }
  torch::set_num_threads(1);  // one core
  auto device = train::resolve_device(args.device);
  if (!device.ok()) return report_failure(device.status().with_context("bench quant --device"));
  const bool gpu = !device->is_cpu();
  const std::int64_t n = args.elements;
  const std::int64_t bytes = n * 4;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  const at::Tensor x = torch::randn({n}, gen);
  // On a GPU the values start there: the encode rows copy them to the host and run the CPU kernels
  // (what the all-reduce does with a GPU's pseudo-gradients), the on-device rows encode them there and
  // copy the payload (what quant::encode does with a GPU tensor), decoding ends with the copy back,
  // and the naive rows are the reference's LibTorch ops on the GPU itself.
  const at::Tensor on_device = gpu ? x.to(*device) : x;
  auto wait = [gpu] {
    if (gpu) torch::cuda::synchronize();
  };

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
  if (gpu) {
    benchmark::RegisterBenchmark("d2h", [&](benchmark::State& st) {
      for (auto _ : st) benchmark::DoNotOptimize(on_device.to(torch::kCPU));
      st.SetBytesProcessed(st.iterations() * bytes);
    });
    benchmark::RegisterBenchmark("h2d", [&](benchmark::State& st) {
      for (auto _ : st) {
        benchmark::DoNotOptimize(x.to(*device));
        wait();
      }
      st.SetBytesProcessed(st.iterations() * bytes);
    });
  }
  register_codecs(args, x, on_device, gpu, *device, wait);

  const std::map<std::string, double> rates = run_registered(args.min_time);
  auto gbs = [&](const std::string& k) {
    auto it = rates.find(k);
    return it == rates.end() ? std::string("-") : fmt::format("{:.2f}", it->second / 1e9);
  };
  fmt::print("\nquant codecs: {} fp32 values ({} MiB), block {}, fp32 scales, one core; GB/s of fp32 input{}\n", n, bytes >> 20, args.block,
             gpu ? "; values on " + device->str() + ": encode = copy to the host + encode, on-device encode = LibTorch ops there + copy of the payload (what encode() does with a GPU tensor), decode = decode + copy to the GPU, naive = LibTorch ops on the GPU" : "");
  fmt::print("memcpy of the same buffer: {} GB/s\n", gbs("memcpy"));
  if (gpu) fmt::print("device-to-host copy: {} GB/s; host-to-device copy: {} GB/s\n", gbs("d2h"), gbs("h2d"));
  fmt::print("\n");
  fmt::print("| codec | bits/value | encode | {}decode | naive encode | naive decode |\n|---|---|---|{}---|---|---|\n", gpu ? "on-device encode | " : "",
             gpu ? "---|" : "");
  for (const auto& t : quant::codec_table()) {
    quant::EncodeOptions o;
    o.codec = t.id;
    o.block_size = static_cast<std::uint32_t>(args.block);
    const std::string name(t.name);
    fmt::print("| {} | {:.3f} | {} | {}{} | {} | {} |\n", name, quant::bits_per_value(o), gbs("encode/" + name),
               gpu ? gbs("device_encode/" + name) + " | " : "", gbs("decode/" + name), gbs("naive_encode/" + name), gbs("naive_decode/" + name));
  }
  return 0;
}

}  // namespace gossamer::app
