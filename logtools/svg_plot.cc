// PlotSvg (declared in log_table.h): a self-contained SVG line chart.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "logtools/log_table.h"

namespace pstrain::logtools {
namespace {

constexpr double kWidth = 820, kHeight = 480;
constexpr double kLeft = 70, kRight = 230, kTop = 50, kBottom = 60;  // margins
const char* const kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22"};

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", v);
  return buf;
}

std::string Escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// 1, 2, 5, 10, 20, 50, ... : the smallest such step giving at most `max_ticks` ticks.
double NiceStep(double range, int max_ticks) {
  double step = std::pow(10.0, std::floor(std::log10(std::max(range, 1e-9) / max_ticks)));
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    if (range / (step * m) <= max_ticks) return step * m;
  }
  return step * 10;
}

// The label of a tick at `v` with step `step`, without needless digits.
std::string TickLabel(double v, double step) {
  int decimals = step >= 1 ? 0 : static_cast<int>(std::ceil(-std::log10(step) - 1e-9));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.*f", decimals, v);
  return buf;
}

}  // namespace

std::string PlotSvg(const std::vector<std::pair<std::string, std::vector<TableRow>>>& logs,
                    const std::string& metric, size_t metric_index) {
  int max_epoch = 1;
  double lo = INFINITY, hi = -INFINITY;
  for (const auto& [name, rows] : logs) {
    for (const TableRow& r : rows) {
      max_epoch = std::max(max_epoch, r.epoch);
      for (const auto* col : {&r.train, &r.valid}) {
        if (metric_index < col->size() && (*col)[metric_index]) {
          lo = std::min(lo, *(*col)[metric_index]);
          hi = std::max(hi, *(*col)[metric_index]);
        }
      }
    }
  }
  if (!(lo <= hi)) {
    lo = 0;
    hi = 1;
  }
  // The range is at least a little of the values' size: a step below the
  // doubles' spacing there would not move the ticks (3e12 everywhere, say).
  double ystep =
      NiceStep(std::max({hi - lo, 1e-3, 1e-6 * std::max(std::abs(lo), std::abs(hi))}), 8);
  double ymin = std::floor(lo / ystep) * ystep, ymax = std::ceil(hi / ystep) * ystep;
  if (ymax <= ymin) ymax = ymin + ystep;
  double xstep = std::max(1.0, NiceStep(max_epoch, 10));
  const double pw = kWidth - kLeft - kRight, ph = kHeight - kTop - kBottom;
  auto px = [&](double epoch) {
    return kLeft + (max_epoch == 1 ? pw / 2 : (epoch - 1) / (max_epoch - 1) * pw);
  };
  auto py = [&](double v) { return kTop + (ymax - v) / (ymax - ymin) * ph; };

  std::string s;
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + Num(kWidth) + "\" height=\"" +
       Num(kHeight) + "\" viewBox=\"0 0 " + Num(kWidth) + " " + Num(kHeight) +
       "\" font-family=\"Helvetica, Arial, sans-serif\" font-size=\"12\">\n";
  s += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  s += "<text x=\"" + Num(kLeft + pw / 2) + "\" y=\"28\" text-anchor=\"middle\" font-size=\"16\">" +
       Escape(metric) + " per epoch</text>\n";
  // Grid and y ticks.
  const long ticks = std::lround((ymax - ymin) / ystep);
  for (long i = 0; i <= ticks && i <= 64; ++i) {
    const double v = ymin + static_cast<double>(i) * ystep;
    double y = py(v);
    s += "<line x1=\"" + Num(kLeft) + "\" y1=\"" + Num(y) + "\" x2=\"" + Num(kLeft + pw) +
         "\" y2=\"" + Num(y) + "\" stroke=\"#e0e0e0\"/>\n";
    s += "<text x=\"" + Num(kLeft - 8) + "\" y=\"" + Num(y + 4) + "\" text-anchor=\"end\">" +
         TickLabel(v, ystep) + "</text>\n";
  }
  // x ticks: epoch 1 and the multiples of the step.
  std::vector<int> xticks = {1};
  for (double e = xstep; e <= max_epoch; e += xstep) {
    if (static_cast<int>(e) != 1) xticks.push_back(static_cast<int>(e));
  }
  for (int e : xticks) {
    double x = px(e);
    s += "<line x1=\"" + Num(x) + "\" y1=\"" + Num(kTop + ph) + "\" x2=\"" + Num(x) + "\" y2=\"" +
         Num(kTop + ph + 5) + "\" stroke=\"#333\"/>\n";
    s += "<text x=\"" + Num(x) + "\" y=\"" + Num(kTop + ph + 20) + "\" text-anchor=\"middle\">" +
         std::to_string(e) + "</text>\n";
  }
  s += "<rect x=\"" + Num(kLeft) + "\" y=\"" + Num(kTop) + "\" width=\"" + Num(pw) +
       "\" height=\"" + Num(ph) + "\" fill=\"none\" stroke=\"#333\"/>\n";
  s += "<text x=\"" + Num(kLeft + pw / 2) + "\" y=\"" + Num(kHeight - 15) +
       "\" text-anchor=\"middle\">epoch</text>\n";
  s += "<text transform=\"translate(20," + Num(kTop + ph / 2) +
       ") rotate(-90)\" text-anchor=\"middle\">" + Escape(metric) + "</text>\n";

  // Curves and legend; labels drop the directory part all the names share.
  size_t common = std::string::npos;
  for (const auto& log : logs) {
    const std::string& n = log.first;
    size_t dir = n.rfind('/');
    size_t len = dir == std::string::npos ? 0 : dir + 1;
    if (common == std::string::npos) {
      common = len;
    } else {
      common = std::min(common, len);
      // Back to the '/' before the last one kept ("/a/b/" -> "/a/" -> "/" -> "").
      while (common > 0 && n.compare(0, common, logs[0].first, 0, common) != 0) {
        const size_t slash = common >= 2 ? logs[0].first.rfind('/', common - 2) : std::string::npos;
        common = slash == std::string::npos ? 0 : slash + 1;
      }
    }
  }
  if (common == std::string::npos) common = 0;
  double ly = kTop + 10;
  for (size_t i = 0; i < logs.size(); ++i) {
    const auto& [name, rows] = logs[i];
    const char* colour = kColours[i % (sizeof(kColours) / sizeof(kColours[0]))];
    for (int valid = 1; valid >= 0; --valid) {
      std::string points;
      int n = 0;
      for (const TableRow& r : rows) {
        const auto& col = valid ? r.valid : r.train;
        if (metric_index >= col.size() || !col[metric_index]) continue;
        points += (n++ ? " " : "") + Num(px(r.epoch)) + "," + Num(py(*col[metric_index]));
      }
      if (n == 0) continue;
      const char* dash = valid ? "" : " stroke-dasharray=\"6,4\"";
      if (n == 1) {
        size_t comma = points.find(',');
        s += "<circle cx=\"" + points.substr(0, comma) + "\" cy=\"" + points.substr(comma + 1) +
             "\" r=\"3\" fill=\"" + colour + "\"/>\n";
      } else {
        s += std::string("<polyline fill=\"none\" stroke=\"") + colour + "\" stroke-width=\"2\"" +
             dash + " points=\"" + points + "\"/>\n";
      }
      double lx = kLeft + pw + 15;
      s += "<line x1=\"" + Num(lx) + "\" y1=\"" + Num(ly) + "\" x2=\"" + Num(lx + 28) + "\" y2=\"" +
           Num(ly) + "\" stroke=\"" + colour + "\" stroke-width=\"2\"" + dash + "/>\n";
      std::string label = name.substr(common);
      // Long paths lose leading directories first, then characters.
      while (label.size() > 24 && label.find('/') != std::string::npos) {
        label = label.substr(label.find('/') + 1);
      }
      if (label.size() > 24) label = "..." + label.substr(label.size() - 21);
      s += "<text x=\"" + Num(lx + 34) + "\" y=\"" + Num(ly + 4) + "\">" + Escape(label) +
           (valid ? " valid" : " train") + "</text>\n";
      ly += 20;
    }
  }
  s += "</svg>\n";
  return s;
}

}  // namespace pstrain::logtools
