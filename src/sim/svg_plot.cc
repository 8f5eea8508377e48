#include "sim/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace pagoda::sim {

std::string xml_escape(const std::string& s) {
  std::string r;
  r.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': r += "&amp;"; break;
      case '<': r += "&lt;"; break;
      case '>': r += "&gt;"; break;
      case '"': r += "&quot;"; break;
      default: r += c;
    }
  }
  return r;
}

std::vector<double> nice_ticks(double lo, double hi, int target) {
  std::vector<double> t;
  if (!(hi > lo) || target < 1) return {lo};
  const double raw = (hi - lo) / target;
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * mag;
    if (step >= raw) break;
  }
  const double first = std::ceil(lo / step - 1e-9) * step;
  for (double v = first; v <= hi + step * 1e-9; v += step) t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

namespace {

const char* kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"};

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f", v);
  return b;
}

std::string tick_label(double v) {
  char b[32];
  if (v == std::floor(v) && std::fabs(v) < 1e15) std::snprintf(b, sizeof b, "%.0f", v);
  else std::snprintf(b, sizeof b, "%g", v);
  return b;
}

}  // namespace

std::string render_svg(const LinePlot& p) {
  const double W = p.width, H = p.height;
  const double left = 80, right = 200, top = 50, bottom = 60;  // legend sits in the right margin
  const double pw = W - left - right, ph = H - top - bottom;
  const double xr = p.x_max > p.x_min ? p.x_max - p.x_min : 1, yr = p.y_max > p.y_min ? p.y_max - p.y_min : 1;
  auto X = [&](double x) { return left + (x - p.x_min) / xr * pw; };
  auto Y = [&](double y) { return top + ph - (y - p.y_min) / yr * ph; };

  std::string s;
  s += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  s += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(W) + "\" height=\"" + num(H) +
       "\" viewBox=\"0 0 " + num(W) + " " + num(H) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  s += "<rect x=\"0\" y=\"0\" width=\"" + num(W) + "\" height=\"" + num(H) + "\" fill=\"white\"/>\n";
  s += "<text x=\"" + num(W / 2) + "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">" +
       xml_escape(p.title) + "</text>\n";

  // Grid and ticks.
  s += "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  const auto xt = nice_ticks(p.x_min, p.x_max, 8), yt = nice_ticks(p.y_min, p.y_max, 8);
  for (double x : xt) s += "<line x1=\"" + num(X(x)) + "\" y1=\"" + num(top) + "\" x2=\"" + num(X(x)) + "\" y2=\"" + num(top + ph) + "\"/>\n";
  for (double y : yt) s += "<line x1=\"" + num(left) + "\" y1=\"" + num(Y(y)) + "\" x2=\"" + num(left + pw) + "\" y2=\"" + num(Y(y)) + "\"/>\n";
  s += "</g>\n<g fill=\"#333333\">\n";
  for (double x : xt) s += "<text x=\"" + num(X(x)) + "\" y=\"" + num(top + ph + 18) + "\" text-anchor=\"middle\">" + tick_label(x) + "</text>\n";
  for (double y : yt) s += "<text x=\"" + num(left - 8) + "\" y=\"" + num(Y(y) + 4) + "\" text-anchor=\"end\">" + tick_label(y) + "</text>\n";
  s += "</g>\n";
  s += "<rect x=\"" + num(left) + "\" y=\"" + num(top) + "\" width=\"" + num(pw) + "\" height=\"" + num(ph) +
       "\" fill=\"none\" stroke=\"#333333\"/>\n";
  s += "<text x=\"" + num(left + pw / 2) + "\" y=\"" + num(H - 16) + "\" text-anchor=\"middle\">" + xml_escape(p.x_label) + "</text>\n";
  s += "<text x=\"20\" y=\"" + num(top + ph / 2) + "\" text-anchor=\"middle\" transform=\"rotate(-90 20 " +
       num(top + ph / 2) + ")\">" + xml_escape(p.y_label) + "</text>\n";

  // Series, clipped to [y_min, y_max] segment by segment.
  double ly = top + 10;
  for (size_t i = 0; i < p.series.size(); ++i) {
    const auto& ser = p.series[i];
    const char* color = kColors[i % (sizeof kColors / sizeof kColors[0])];
    std::vector<std::vector<std::pair<double, double>>> runs(1);
    for (size_t k = 0; k + 1 < ser.points.size(); ++k) {
      auto [x0, y0] = ser.points[k];
      auto [x1, y1] = ser.points[k + 1];
      // Clip the segment against y_min <= y <= y_max (x is within range by construction).
      auto clip = [&](double bound, bool upper) {
        const bool out0 = upper ? y0 > bound : y0 < bound, out1 = upper ? y1 > bound : y1 < bound;
        if (out0 && out1) return false;
        if (out0 || out1) {
          const double t = (bound - y0) / (y1 - y0);
          const double xi = x0 + t * (x1 - x0);
          if (out0) { x0 = xi; y0 = bound; } else { x1 = xi; y1 = bound; }
        }
        return true;
      };
      if (!clip(p.y_max, true) || !clip(p.y_min, false)) {
        if (!runs.back().empty()) runs.emplace_back();
        continue;
      }
      if (!runs.back().empty() && runs.back().back() != std::make_pair(x0, y0)) runs.emplace_back();
      if (runs.back().empty()) runs.back().push_back({x0, y0});
      runs.back().push_back({x1, y1});
    }
    for (const auto& run : runs) {
      if (run.size() < 2) continue;
      s += "<polyline fill=\"none\" stroke=\"" + std::string(color) + "\" stroke-width=\"2\" points=\"";
      for (const auto& [x, y] : run) s += num(X(x)) + "," + num(Y(y)) + " ";
      s += "\"/>\n";
    }
    for (const auto& [x, y] : ser.markers) {
      if (x < p.x_min || x > p.x_max || y < p.y_min || y > p.y_max) continue;
      s += "<circle cx=\"" + num(X(x)) + "\" cy=\"" + num(Y(y)) + "\" r=\"4\" fill=\"" + color + "\"/>\n";
    }
    s += "<line x1=\"" + num(left + pw + 15) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(left + pw + 40) + "\" y2=\"" +
         num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"2\"/>\n";
    s += "<text x=\"" + num(left + pw + 46) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(ser.label) + "</text>\n";
    ly += 20;
  }
  for (size_t i = 0; i < p.hlines.size(); ++i) {
    const auto& h = p.hlines[i];
    const char* color = i == 0 ? "#d62728" : "#000000";
    if (h.y >= p.y_min && h.y <= p.y_max) {
      s += "<line x1=\"" + num(left) + "\" y1=\"" + num(Y(h.y)) + "\" x2=\"" + num(left + pw) + "\" y2=\"" +
           num(Y(h.y)) + "\" stroke=\"" + color + "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
    }
    s += "<line x1=\"" + num(left + pw + 15) + "\" y1=\"" + num(ly) + "\" x2=\"" + num(left + pw + 40) + "\" y2=\"" +
         num(ly) + "\" stroke=\"" + color + "\" stroke-width=\"1.5\" stroke-dasharray=\"6,4\"/>\n";
    s += "<text x=\"" + num(left + pw + 46) + "\" y=\"" + num(ly + 4) + "\">" + xml_escape(h.label) + "</text>\n";
    ly += 20;
  }
  s += "</svg>\n";
  return s;
}

}  // namespace pagoda::sim
