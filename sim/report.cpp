#include "sim/report.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>

#include <fmt/format.h>

#include "core/file.h"
#include "optim/method.h"
#include "train/run_folder.h"

namespace gossamer::sim {

namespace {

int evaluator_of(const MethodRun& run) {
  for (const auto& rec : run.result.records) {
    if (rec.contains("val_loss")) return rec["worker"].get<int>();
  }
  return 0;
}

struct Point {
  double step, bytes, time, loss;
};

std::vector<Point> eval_curve(const MethodRun& run) {
  std::vector<Point> out;
  for (const auto& rec : run.result.records) {
    if (!rec.contains("val_loss")) continue;
    out.push_back(Point{rec["step"].get<double>(), rec["bytes_sent"].get<double>(), rec["time_s"].get<double>(), rec["val_loss"].get<double>()});
  }
  return out;
}

std::string escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '&': o += "&amp;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string human_bytes(double b) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB", "PB"};
  int u = 0;
  while (b >= 1000 && u < 5) b /= 1000, ++u;
  return fmt::format("{:.3g} {}", b, units[u]);
}

// A pipeline's omission check in words: "3, 4, 5 out: +1.2%", and the model as trained where depth
// scaling changed it.
std::string omission_text(const nlohmann::json& p) {
  if (!p.contains("omitted_val_loss") || p["omitted_stages"].empty()) return "-";
  std::string stages;
  for (const auto& st : p["omitted_stages"]) stages += (stages.empty() ? "" : ", ") + std::to_string(st.get<int>());
  const double all = p["val_loss"].get<double>(), as_trained = p["val_loss_as_trained"].get<double>();
  std::string text = fmt::format("{} out: {:+.1f}%", stages, 100 * (p["omitted_val_loss"].get<double>() / all - 1));
  if (as_trained != all) {
    text += fmt::format(" (unscaled: {:.4f}, {:+.1f}%)", as_trained, 100 * (p["omitted_val_loss_as_trained"].get<double>() / as_trained - 1));
  }
  return text;
}

std::string human_seconds(double s) {
  if (s < 120) return fmt::format("{:.3g} s", s);
  if (s < 7200) return fmt::format("{:.3g} min", s / 60);
  return fmt::format("{:.3g} h", s / 3600);
}

const char* kColors[] = {"#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"};

struct Series {
  std::string name;
  std::string color;
  std::vector<std::pair<double, double>> points;
};

std::vector<double> nice_ticks(double lo, double hi) {
  const double span = hi - lo;
  if (!(span > 0)) return {lo};
  const double raw = span / 5;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    if (raw <= m * mag) {
      step = m * mag;
      break;
    }
  }
  std::vector<double> t;
  for (double v = std::ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) t.push_back(v);
  return t;
}

// Ticks of a log10 axis from 10^lo to 10^hi: every whole decade inside, or, where fewer than two
// are, the axis's two ends (moved `inset` decades inward).
std::vector<double> decade_ticks(double lo, double hi, double inset) {
  std::vector<double> t;
  for (double e = std::ceil(lo); e <= std::floor(hi); e += 1) t.push_back(std::pow(10.0, e));
  if (t.size() < 2) t = {std::pow(10.0, lo + inset), std::pow(10.0, hi - inset)};
  return t;
}

// A line chart as inline SVG: x linear or log10, y linear, optional horizontal reference line.
std::string svg_chart(const std::string& title, const std::string& xlabel, const std::vector<Series>& series, bool log_x,
                      const std::function<std::string(double)>& xfmt, std::optional<double> hline, const std::string& hline_label) {
  constexpr double W = 560, H = 340, L = 62, R = 16, T = 30, B = 48;
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& s : series) {
    for (auto [x, y] : s.points) {
      if (log_x && x <= 0) continue;
      const double xv = log_x ? std::log10(x) : x;
      x0 = std::min(x0, xv), x1 = std::max(x1, xv), y0 = std::min(y0, y), y1 = std::max(y1, y);
    }
  }
  if (hline) y0 = std::min(y0, *hline), y1 = std::max(y1, *hline);
  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">)", W, H, W, H,
                   escape(title));
  o << fmt::format(R"(<text x="{}" y="18" text-anchor="middle" class="t">{}</text>)", W / 2, escape(title));
  if (!std::isfinite(x0)) {
    o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no data</text></svg>)", W / 2, H / 2);
    return o.str();
  }
  if (x1 <= x0) x1 = x0 + 1;
  const double pad = (y1 - y0) * 0.05 + 1e-9;
  y0 -= pad, y1 += pad;
  auto px = [&](double x) { return L + ((log_x ? std::log10(x) : x) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  o << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)", L, T, W - L - R, H - T - B);
  for (double v : nice_ticks(y0, y1)) {
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#eee"/><text x="{}" y="{:.1f}" text-anchor="end" class="k">{:.3g}</text>)", L,
                     W - R, py(v), py(v), L - 6, py(v) + 4, v);
  }
  for (double v : log_x ? decade_ticks(x0, x1, 0.0) : nice_ticks(x0, x1)) {
    o << fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#eee"/><text x="{:.1f}" y="{}" text-anchor="middle" class="k">{}</text>)", px(v),
                     px(v), T, H - B, px(v), H - B + 16, escape(xfmt(v)));
  }
  o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" class="a">{}</text>)", L + (W - L - R) / 2, H - 10, escape(xlabel));
  o << fmt::format(R"~(<text x="14" y="{}" text-anchor="middle" class="a" transform="rotate(-90 14 {})">validation loss (nats/byte)</text>)~", T + (H - T - B) / 2,
                   T + (H - T - B) / 2);
  if (hline) {
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#555" stroke-dasharray="5 4"/><text x="{}" y="{:.1f}" text-anchor="end" class="k">{}</text>)",
                     L, W - R, py(*hline), py(*hline), W - R - 4, py(*hline) - 5, escape(hline_label));
  }
  for (const auto& s : series) {
    std::string pts;
    for (auto [x, y] : s.points) {
      if (log_x && x <= 0) continue;
      pts += fmt::format("{:.1f},{:.1f} ", px(x), py(y));
    }
    if (pts.empty()) continue;
    o << fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="2" points="{}"/>)", s.color, pts);
  }
  double ly = T + 14;
  for (const auto& s : series) {
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="{}" stroke-width="3"/><text x="{}" y="{:.1f}" class="k">{}</text>)", W - R - 150,
                     W - R - 130, ly, ly, s.color, W - R - 125, ly + 4, escape(s.name));
    ly += 16;
  }
  o << "</svg>";
  return o.str();
}

}  // namespace

nlohmann::json method_summary(const MethodRun& run, double target_loss) {
  const auto& r = run.result;
  const int evaluator = evaluator_of(run);
  const auto curve = eval_curve(run);
  double sent = 0, received = 0, util = 0, gossip = 0, membership = 0, min_util = 1.0, alone = 0;
  std::int64_t tokens = 0, rounds = 0, skipped = 0, merged = 0, carried = 0, lost = 0;
  std::uint64_t left_out = 0;
  int alive = 0;
  for (std::size_t i = 0; i < r.accounts.size(); ++i) {
    const auto& a = r.accounts[i];
    tokens += a.tokens;
    merged += a.merged_tokens;
    carried += a.late_tokens_carried;
    lost += a.late_tokens_lost;
    left_out += a.left_out;
    // Goodput's denominator: what this worker's hardware trains alone (at the pace its own steps
    // took) from its start to the run's end, downtime and waiting included.
    const double started = i < r.started_s.size() ? r.started_s[i] : 0.0;
    if (a.compute_s > 0 && started >= 0) alone += static_cast<double>(a.computed_tokens) / a.compute_s * std::max(0.0, r.sim_time_s - started);
    if (r.crashed[i]) continue;
    ++alive;
    sent += static_cast<double>(a.bytes_sent);
    gossip += static_cast<double>(a.gossip_bytes_sent);
    membership += static_cast<double>(a.membership_bytes_sent);
    received += static_cast<double>(a.bytes_received);
    const double u = a.compute_s + a.blocked_s > 0 ? a.compute_s / (a.compute_s + a.blocked_s) : 1.0;
    util += u;
    min_util = std::min(min_util, u);
    rounds = std::max(rounds, a.rounds);
    skipped = std::max(skipped, a.skipped_rounds);
  }
  nlohmann::json s = {{"name", run.name},
                      {"workers", r.accounts.size()},
                      {"crashed_workers", std::count(r.crashed.begin(), r.crashed.end(), true)},
                      {"tokens", tokens},
                      {"bytes_sent_per_worker", alive > 0 ? sent / alive : 0.0},
                      {"bytes_received_per_worker", alive > 0 ? received / alive : 0.0},
                      // of bytes_sent: the membership gossip, the same for every method (it depends on time, not on the model)
                      {"gossip_bytes_sent_per_worker", alive > 0 ? gossip / alive : 0.0},
                      // of which membership itself (probes, news, digests); the rest is round agreement and announcements
                      {"membership_bytes_sent_per_worker", alive > 0 ? membership / alive : 0.0},
                      {"sim_time_s", r.sim_time_s},
                      {"compute_utilization", alive > 0 ? util / alive : 0.0},
                      {"min_compute_utilization", alive > 0 ? min_util : 0.0},  // of the worker that waited most
                      // tokens that reached the shared model over those the same workers train alone in the run's time
                      {"merged_tokens", merged},
                      {"goodput", alone > 0 ? static_cast<double>(merged) / alone : 0.0},
                      // of workers left out of a round (late): tokens carried into a later round at their age's weight, and tokens lost
                      {"late_tokens_carried", carried},
                      {"late_tokens_lost", lost},
                      {"rounds", rounds},
                      {"skipped_rounds", skipped},
                      {"stalls", r.stalls},  // sim.stalls_per_minute
                      {"left_out", left_out},  // contributions left out by robust aggregation, all owners
                      {"parameters", r.parameters},
                      {"evaluated_worker", evaluator},
                      {"wall_s", r.wall_s},
                      {"target_loss", target_loss}};
  if (r.pipeline.is_object()) {
    nlohmann::json p = r.pipeline;
    p.erase("timeline");  // in the report's chart; too long for a summary
    s["pipeline"] = std::move(p);
  }
  s["final_val_loss"] = curve.empty() ? nlohmann::json(nullptr) : nlohmann::json(curve.back().loss);
  s["time_to_target_s"] = nullptr;
  for (const auto& p : curve) {
    if (p.loss <= target_loss) {
      s["time_to_target_s"] = p.time;
      break;
    }
  }
  return s;
}

double default_target_loss(const std::vector<MethodRun>& runs) {
  double best = std::numeric_limits<double>::infinity();
  for (const auto& run : runs) {
    const auto curve = eval_curve(run);
    if (curve.empty()) continue;
    if (run.name == "ddp") return curve.back().loss * 1.10;
    best = std::min(best, curve.back().loss);
  }
  return std::isfinite(best) ? best * 1.10 : 0.0;
}

namespace {

// One sentence per method on what shapes its curve, for the report's readers (docs/methods.md).
std::string method_note(const std::string& name) {
  if (name == "pipeline-full") return "the full pipeline (DT-FM): every micro-batch visits every stage in order, along fixed chains of nodes.";
  if (name == "skippipe-random") return "skips stages, with paths planned without looking at the links' costs (the reference's cost-blind baseline).";
  if (name == "skippipe-noca") return "skips stages, with paths planned on the links' costs but not on collisions between micro-batches (no TC2).";
  if (name == "skippipe-cbs") return "SkipPipe: paths planned on the links' costs by conflict-based search, collisions resolved in simulation (TC2).";
  if (auto method = optim::parse_method(name); method.ok()) return std::string(optim::method_info(*method).note);
  return "";
}

// A pipeline iteration's timeline as inline SVG: a row per node (grouped by stage), a bar per
// piece of compute: solid for a forward, pale for a backward, grey for the head and loss, each
// micro-batch its own hue.
std::string svg_timeline(const std::string& title, const nlohmann::json& timeline, std::int64_t microbatches) {
  struct Row {
    int node, stage;
    const nlohmann::json* spans;
  };
  std::vector<Row> rows;
  double end = 0;
  for (const auto& n : timeline) {
    rows.push_back(Row{n["node"].get<int>(), n["stage"].get<int>(), &n["spans"]});
    for (const auto& sp : n["spans"]) end = std::max(end, sp[3].get<double>());
  }
  std::stable_sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.stage < b.stage; });
  constexpr double W = 1100, L = 120, R = 16, T = 30, B = 40, RowH = 14;
  const double H = T + B + RowH * static_cast<double>(rows.size());
  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">)", W, H, W, H,
                   escape(title));
  o << fmt::format(R"(<text x="{}" y="18" text-anchor="middle" class="t">{}</text>)", W / 2, escape(title));
  if (rows.empty() || !(end > 0)) {
    o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no data</text></svg>)", W / 2, H / 2);
    return o.str();
  }
  auto px = [&](double t) { return L + t / end * (W - L - R); };
  for (double v : nice_ticks(0, end)) {
    o << fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#eee"/><text x="{:.1f}" y="{}" text-anchor="middle" class="k">{}</text>)", px(v),
                     px(v), T, H - B, px(v), H - B + 14, escape(human_seconds(v)));
  }
  o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" class="a">simulated time since the iteration started</text>)", L + (W - L - R) / 2, H - 8);
  const double mbs = static_cast<double>(std::max<std::int64_t>(1, microbatches));
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const double y = T + RowH * static_cast<double>(i);
    o << fmt::format(R"(<text x="{}" y="{:.1f}" text-anchor="end" class="k">node {} (stage {})</text>)", L - 6, y + RowH - 3, rows[i].node, rows[i].stage);
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#f2f2f2"/>)", L, W - R, y + RowH, y + RowH);
    for (const auto& sp : *rows[i].spans) {
      const auto mb = sp[0].get<std::int64_t>();
      const std::string kind = sp[1].get<std::string>();
      const double a = sp[2].get<double>(), b = sp[3].get<double>();
      const std::string fill = kind == "H" ? "#555" : fmt::format("hsl({:.0f},70%,{}%)", std::fmod(static_cast<double>(mb) * 360.0 / mbs * 7.0, 360.0),
                                                                   kind == "F" ? 45 : 78);
      o << fmt::format(R"(<rect x="{:.2f}" y="{:.1f}" width="{:.2f}" height="{}" fill="{}"><title>node {}: micro-batch {} {} {:.2f}-{:.2f} s</title></rect>)", px(a),
                       y + 1, std::max(0.5, px(b) - px(a)), RowH - 2, fill, rows[i].node, mb,
                       kind == "F" ? "forward" : kind == "B" ? "backward" : "head and loss", a, b);
    }
  }
  o << "</svg>";
  return o.str();
}

}  // namespace

namespace {

// A method's point on the frontier chart: those with a final loss and bytes sent (a log scale has
// no place for zero), in the summary's order, coloured as in the other charts.
struct FrontierPoint {
  std::string name;
  double bytes, loss;
  std::string color;
};

std::vector<FrontierPoint> frontier_points(const nlohmann::json& methods) {
  std::vector<FrontierPoint> out;
  std::size_t i = 0;
  for (const auto& m : methods) {
    const std::string color = kColors[i++ % std::size(kColors)];
    if (!m.contains("final_val_loss") || m["final_val_loss"].is_null() || !(m.value("bytes_sent_per_worker", 0.0) > 0)) continue;
    out.push_back({m["name"].get<std::string>(), m["bytes_sent_per_worker"].get<double>(), m["final_val_loss"].get<double>(), color});
  }
  return out;
}

}  // namespace

std::vector<std::string> frontier_methods(const nlohmann::json& methods) {
  using Point = FrontierPoint;
  std::vector<Point> pts = frontier_points(methods);
  std::sort(pts.begin(), pts.end(), [](const Point& a, const Point& b) { return a.bytes != b.bytes ? a.bytes < b.bytes : a.loss < b.loss; });
  std::vector<std::string> out;
  for (const auto& p : pts) {
    const bool beaten = std::any_of(pts.begin(), pts.end(), [&](const Point& q) {
      return q.bytes <= p.bytes && q.loss <= p.loss && (q.bytes < p.bytes || q.loss < p.loss);
    });
    if (!beaten) out.push_back(p.name);
  }
  return out;
}

std::string svg_frontier(const nlohmann::json& methods) {
  constexpr double W = 560, H = 340, L = 62, R = 16, T = 30, B = 48;
  const std::string title = "Final validation loss vs bytes sent per worker";
  const std::vector<FrontierPoint> pts = frontier_points(methods);
  std::optional<std::pair<double, double>> ddp;  // bytes, loss
  for (const auto& p : pts) {
    if (p.name == "ddp") ddp = std::make_pair(p.bytes, p.loss);
  }
  std::ostringstream o;
  o << fmt::format(R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {} {}" width="{}" height="{}" role="img" aria-label="{}">)", W, H, W, H, escape(title));
  o << fmt::format(R"(<text x="{}" y="18" text-anchor="middle" class="t">{}</text>)", W / 2, escape(title));
  if (pts.empty()) {
    o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle">no data</text></svg>)", W / 2, H / 2);
    return o.str();
  }
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  for (const auto& p : pts) {
    x0 = std::min(x0, std::log10(p.bytes)), x1 = std::max(x1, std::log10(p.bytes));
    y0 = std::min(y0, p.loss), y1 = std::max(y1, p.loss);
  }
  if (ddp) {
    x0 = std::min(x0, std::log10(ddp->first / 1000));
    y1 = std::max(y1, ddp->second * 1.01);
  }
  x0 -= 0.15, x1 += 0.15;
  // One method alone (or all at one loss) spans nothing: pad by 1% of the loss so the ticks differ.
  const double pad = std::max((y1 - y0) * 0.08, 0.01 * std::max(std::abs(y1), 1e-3));
  y0 -= pad, y1 += pad;
  auto px = [&](double bytes) { return L + (std::log10(bytes) - x0) / (x1 - x0) * (W - L - R); };
  auto py = [&](double y) { return T + (y1 - y) / (y1 - y0) * (H - T - B); };
  o << fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#999"/>)", L, T, W - L - R, H - T - B);
  for (double v : nice_ticks(y0, y1)) {
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#eee"/><text x="{}" y="{:.1f}" text-anchor="end" class="k">{:.4g}</text>)", L,
                     W - R, py(v), py(v), L - 6, py(v) + 4, v);
  }
  for (double v : decade_ticks(x0, x1, 0.05)) {
    o << fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#eee"/><text x="{:.1f}" y="{}" text-anchor="middle" class="k">{}</text>)", px(v),
                     px(v), T, H - B, px(v), H - B + 16, escape(human_bytes(v)));
  }
  o << fmt::format(R"(<text x="{}" y="{}" text-anchor="middle" class="a">bytes sent per worker (log scale)</text>)", L + (W - L - R) / 2, H - 10);
  o << fmt::format(R"~(<text x="14" y="{}" text-anchor="middle" class="a" transform="rotate(-90 14 {})">final validation loss</text>)~", T + (H - T - B) / 2,
                   T + (H - T - B) / 2);
  if (ddp) {  // the target corner: within 1% of ddp's loss, at 1000x fewer bytes or less
    const double yl = py(ddp->second * 1.01), xl = px(ddp->first / 1000);
    o << fmt::format(R"(<line x1="{}" x2="{}" y1="{:.1f}" y2="{:.1f}" stroke="#555" stroke-dasharray="5 4"/><text x="{}" y="{:.1f}" text-anchor="end" class="k">ddp + 1%</text>)",
                     L, W - R, yl, yl, W - R - 4, yl - 5);
    o << fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#555" stroke-dasharray="2 4"/><text x="{:.1f}" y="{}" class="k">1000x fewer than ddp</text>)",
                     xl, xl, T, H - B, xl + 4, T + 12);
  }
  // The frontier, then the points (filled on it, hollow off it), each labelled.
  const auto on = frontier_methods(methods);
  std::string line;
  for (const auto& name : on) {
    for (const auto& p : pts) {
      if (p.name == name) line += fmt::format("{:.1f},{:.1f} ", px(p.bytes), py(p.loss));
    }
  }
  if (!line.empty()) o << fmt::format(R"(<polyline fill="none" stroke="#bbb" stroke-width="1.5" points="{}"/>)", line);
  for (const auto& p : pts) {
    const bool front = std::find(on.begin(), on.end(), p.name) != on.end();
    const std::string vs = ddp && p.name != "ddp" ? fmt::format(" ({:.0f}x)", ddp->first / p.bytes) : "";
    o << fmt::format(R"(<circle data-method="{}" cx="{:.1f}" cy="{:.1f}" r="5" fill="{}" stroke="{}" stroke-width="2"/>)", escape(p.name), px(p.bytes),
                     py(p.loss), front ? p.color : "#fff", p.color);
    o << fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="k">{}</text>)", px(p.bytes) + 8, py(p.loss) - 6, escape(p.name + vs));
  }
  o << "</svg>";
  return o.str();
}

std::string report_html(const std::vector<MethodRun>& runs, const nlohmann::json& summary, const ReportContext& ctx) {
  std::vector<Series> by_step, by_bytes, by_time;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const std::string color = kColors[i % std::size(kColors)];
    Series a{runs[i].name, color, {}}, b = a, c = a;
    for (const auto& p : eval_curve(runs[i])) {
      a.points.emplace_back(p.step, p.loss);
      b.points.emplace_back(p.bytes, p.loss);
      c.points.emplace_back(p.time, p.loss);
    }
    by_step.push_back(std::move(a));
    by_bytes.push_back(std::move(b));
    by_time.push_back(std::move(c));
  }
  const std::string floor_label = ctx.entropy_floor ? fmt::format("entropy floor {:.3f}", *ctx.entropy_floor) : "";
  std::ostringstream o;
  o << "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" << escape(ctx.title) << "</title>\n<style>"
    << "body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}h1{font-size:22px}"
    << ".charts{display:flex;flex-wrap:wrap;gap:12px}svg{background:#fff;border:1px solid #ddd}"
    << "svg .t{font-size:14px;font-weight:600}svg .k{font-size:11px;fill:#444}svg .a{font-size:12px;fill:#222}"
    << "table{border-collapse:collapse;margin-top:16px;font-size:14px}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
    << "th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}.note{color:#555;font-size:13px}</style></head><body>\n";
  o << "<h1>" << escape(ctx.title) << "</h1>\n<p class=\"note\">Data: " << escape(ctx.data_description) << "<br>Network: "
    << escape(ctx.network_description) << "<br>Validation loss of one worker per method, in nats per byte; bytes are those one worker sent "
    << "(payloads and frame headers). Time is simulated wall-clock.</p>\n<div class=\"charts\">\n";
  bool all_pipelines = !runs.empty();
  for (const auto& run : runs) all_pipelines = all_pipelines && run.result.pipeline.is_object();
  const std::string steps = all_pipelines ? "iterations" : "inner steps";
  o << svg_chart("Validation loss vs " + steps, steps, by_step, false, [](double v) { return fmt::format("{:.0f}", v); }, ctx.entropy_floor,
                 floor_label);
  o << svg_chart("Validation loss vs bytes sent per worker", "bytes sent per worker (log scale)", by_bytes, true, human_bytes, ctx.entropy_floor,
                 floor_label);
  o << svg_chart("Validation loss vs simulated wall-clock", "simulated time", by_time, false, human_seconds, ctx.entropy_floor, floor_label);
  if (!all_pipelines) o << svg_frontier(summary["methods"]);
  o << "</div>\n<table><tr><th>method</th><th>final val loss</th><th>tokens</th><th>bytes sent / worker</th><th>vs ddp</th>"
    << "<th>simulated time</th><th>compute utilization</th><th>goodput</th><th>time to " << fmt::format("{:.3f}", ctx.target_loss)
    << "</th><th>rounds</th><th>skipped</th></tr>\n";
  double ddp_bytes = 0;
  for (const auto& m : summary["methods"]) {
    if (m["name"] == "ddp") ddp_bytes = m["bytes_sent_per_worker"].get<double>();
  }
  for (const auto& m : summary["methods"]) {
    const double bytes = m["bytes_sent_per_worker"].get<double>();
    std::string vs = "";
    if (ddp_bytes > 0 && bytes > 0 && m["name"] != "ddp") vs = fmt::format("{:.0f}x fewer", ddp_bytes / bytes);
    o << "<tr><td>" << escape(m["name"].get<std::string>()) << "</td><td>"
      << (m["final_val_loss"].is_null() ? std::string("-") : fmt::format("{:.4f}", m["final_val_loss"].get<double>())) << "</td><td>"
      << m["tokens"].get<std::int64_t>() << "</td><td>" << human_bytes(bytes) << "</td><td>" << vs << "</td><td>"
      << human_seconds(m["sim_time_s"].get<double>()) << "</td><td>" << fmt::format("{:.1f}%", 100 * m["compute_utilization"].get<double>()) << "</td><td>"
      << fmt::format("{:.1f}%", 100 * m.value("goodput", 0.0)) << "</td><td>"
      << (m["time_to_target_s"].is_null() ? std::string("not reached") : human_seconds(m["time_to_target_s"].get<double>())) << "</td><td>"
      << m["rounds"].get<std::int64_t>() << "</td><td>" << m["skipped_rounds"].get<std::int64_t>() << "</td></tr>\n";
  }
  o << "</table>\n";
  bool pipelines = false;
  for (const auto& run : runs) pipelines = pipelines || run.result.pipeline.is_object();
  if (pipelines) {
    o << "<h2>Pipeline iterations</h2>\n<p class=\"note\">An iteration's makespan as the runtime took it over the emulated links, beside "
      << "the scheduler's prediction (its event simulation of the schedule) and its closed form (collisions and memory waits left out); then "
      << "the stages' sync. Busy: the nodes' mean share of the pipeline's time spent computing. Omission check: the validation loss "
      << "at the end with the second half of the stages left out, against all of them (a model trained with skipping should lose "
      << "less).</p>\n<table><tr><th>variant</th><th>mode</th>"
      << "<th>iteration (simulated)</th><th>predicted</th><th>closed form</th><th>stage sync</th><th>busy</th><th>peak in flight</th>"
      << "<th>activations</th><th>stage sync bytes</th><th>omission check</th></tr>\n";
    for (const auto& run : runs) {
      const auto& p = run.result.pipeline;
      if (!p.is_object()) continue;
      double busy = 0, idle = 0;
      int peak = 0;
      for (const auto& b : p["node_busy_s"]) busy += b.get<double>();
      for (const auto& b : p["node_idle_s"]) idle += b.get<double>();
      for (const auto& k : p["node_peak_inflight"]) peak = std::max(peak, k.get<int>());
      o << "<tr><td>" << escape(run.name) << "</td><td>" << escape(p["mode"].get<std::string>()) << "</td><td>" << human_seconds(p["makespan_s"].get<double>())
        << "</td><td>" << human_seconds(p["predicted_makespan_s"].get<double>()) << "</td><td>" << human_seconds(p["closed_form_makespan_s"].get<double>())
        << "</td><td>" << human_seconds(p["sync_s"].get<double>()) << "</td><td>" << fmt::format("{:.1f}%", busy + idle > 0 ? 100 * busy / (busy + idle) : 0.0)
        << "</td><td>" << peak << "</td><td>" << human_bytes(p["activation_bytes"].get<double>()) << "</td><td>"
        << human_bytes(p["sync_bytes"].get<double>()) << "</td><td>" << escape(omission_text(p)) << "</td></tr>\n";
    }
    o << "</table>\n<p class=\"note\">Which node computes which micro-batch when, in the first iteration: solid bars are forwards, pale "
      << "ones backwards, grey ones the head and loss at the micro-batch's origin; each micro-batch has its own hue. Hover a bar for its "
      << "times.</p>\n";
    for (const auto& run : runs) {
      const auto& p = run.result.pipeline;
      if (!p.is_object()) continue;
      o << svg_timeline(run.name + ": the first iteration", p["timeline"], p["microbatches"].get<std::int64_t>()) << "\n";
    }
  }
  o << "<ul class=\"note\">\n";
  for (const auto& run : runs) {
    const std::string note = method_note(run.name);
    if (!note.empty()) o << "<li><b>" << escape(run.name) << "</b> " << escape(note) << "</li>\n";
  }
  o << "</ul>\n<p class=\"note\">Per-method metrics: &lt;method&gt;/metrics.jsonl; all figures: summary.json.</p>\n</body></html>\n";
  return o.str();
}

Result<nlohmann::json> write_comparison(const std::filesystem::path& out, const std::vector<MethodRun>& runs, const ReportContext& ctx) {
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return error(ErrorCode::kIoError, "cannot create " + out.string() + ": " + ec.message());
  nlohmann::json summary = {{"title", ctx.title}, {"data", ctx.data_description}, {"network", ctx.network_description},
                            {"target_loss", ctx.target_loss}, {"methods", nlohmann::json::array()}};
  if (ctx.entropy_floor) summary["entropy_floor"] = *ctx.entropy_floor;
  for (const auto& run : runs) {
    std::string lines;
    for (const auto& rec : run.result.records) lines += rec.dump() + "\n";
    std::filesystem::create_directories(out / run.name, ec);
    if (ec) return error(ErrorCode::kIoError, "cannot create " + (out / run.name).string() + ": " + ec.message());
    if (Status st = write_file_atomic(out / run.name / train::kMetricsFile, as_bytes(lines)); !st.ok()) return st;
    summary["methods"].push_back(method_summary(run, ctx.target_loss));
  }
  if (Status st = write_file_atomic(out / train::kSummaryFile, as_bytes(summary.dump(2) + "\n")); !st.ok()) return st;
  if (Status st = write_file_atomic(out / train::kReportFile, as_bytes(report_html(runs, summary, ctx))); !st.ok()) return st;
  return summary;
}

}  // namespace gossamer::sim
