#include "train/metrics.h"

#include <chrono>
#include <cstdio>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/file.h"

namespace gossamer::train {

Result<MetricsWriter> MetricsWriter::open(const std::filesystem::path& path, std::optional<std::int64_t> keep_up_to_step) {
  MetricsWriter w;
  w.path_ = path;
  w.keep_up_to_step_ = keep_up_to_step;
  if (!keep_up_to_step.has_value()) {
    w.out_.open(path, std::ios::trunc);
    if (!w.out_) return error(ErrorCode::kIoError, "cannot open " + path.string() + " for writing");
  }
  return w;
}

Status MetricsWriter::open_for_resume() {
  if (std::filesystem::exists(path_)) {
    auto text = read_text_file(path_, std::size_t{1} << 32);
    if (!text.ok()) return text.status();
    std::istringstream in(*text);
    std::string kept, line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded()) continue;  // a torn last line from a crash
      if (j.contains("step") && j["step"].is_number_integer() && j["step"].get<std::int64_t>() > *keep_up_to_step_) continue;
      kept += line + "\n";
    }
    if (kept != *text) {
      Status st = write_file_atomic(path_, as_bytes(kept));
      if (!st.ok()) return st;
    }
  }
  out_.open(path_, std::ios::app);
  if (!out_) return error(ErrorCode::kIoError, "cannot open " + path_.string() + " for writing");
  keep_up_to_step_.reset();
  return Status();
}

Status MetricsWriter::write(const nlohmann::json& record) {
  if (keep_up_to_step_.has_value()) {
    if (Status st = open_for_resume(); !st.ok()) return st;
  }
  out_ << record.dump() << '\n';
  out_.flush();
  if (!out_) return error(ErrorCode::kIoError, "cannot write to " + path_.string());
  return Status();
}

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
std::string eta_text(double seconds) {
  if (!(seconds >= 0) || seconds > 1e7) return "--:--";
  const auto s = static_cast<long>(seconds + 0.5);
  return fmt::format("{:02}:{:02}", s / 60, s % 60);
}
}  // namespace

// Progress is about the user's wall-clock, so it reads the real clock directly even in simulations.
ProgressReporter::ProgressReporter(std::int64_t total_steps, bool terminal)
    : total_(total_steps), terminal_(terminal), start_s_(now_s()) {}

void ProgressReporter::update(std::int64_t step, double train_loss, std::optional<double> val_loss, double tok_per_s) {
  if (val_loss) last_val_ = val_loss;
  const double elapsed = now_s() - start_s_;
  const double frac = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 1.0;
  const double eta = frac > 0 ? elapsed * (1.0 - frac) / frac : -1.0;
  const std::string val = last_val_ ? fmt::format("{:.4f}", *last_val_) : std::string("-");
  if (terminal_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(frac * kWidth);
    std::string bar(static_cast<std::size_t>(filled), '#');
    bar.resize(kWidth, '.');
    std::fprintf(stderr, "\r[%s] %lld/%lld loss %.4f val %s %.0f tok/s eta %s   ", bar.c_str(), static_cast<long long>(step),
                 static_cast<long long>(total_), train_loss, val.c_str(), tok_per_s, eta_text(eta).c_str());
    std::fflush(stderr);
    return;
  }
  // Plain log: about 20 lines per run, plus every evaluation.
  const std::int64_t every = std::max<std::int64_t>(1, total_ / 20);
  if (val_loss || step - last_logged_ >= every || step == total_) {
    spdlog::info("step {}/{} loss {:.4f} val {} {:.0f} tok/s eta {}", step, total_, train_loss, val, tok_per_s, eta_text(eta));
    last_logged_ = step;
  }
}

void ProgressReporter::finish() {
  if (terminal_) std::fprintf(stderr, "\n");
}

}  // namespace gossamer::train
