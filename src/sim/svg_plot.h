// A minimal hand-written SVG line chart (no dependencies): linear axes with
// labelled ticks, one polyline per series, dashed horizontal reference lines
// and a legend. Points outside the y range are clipped to the plot area.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace pagoda::sim {

struct PlotSeries {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  std::vector<std::pair<double, double>> markers; // drawn as dots (inside the ranges only)
};

struct PlotHLine {
  std::string label;
  double y = 0;
};

struct LinePlot {
  std::string title;
  std::string x_label;
  std::string y_label;
  double x_min = 0, x_max = 1;
  double y_min = 0, y_max = 1;
  std::vector<PlotSeries> series;
  std::vector<PlotHLine> hlines;
  int width = 800, height = 500;
};

std::string render_svg(const LinePlot& plot);

// "Nice" tick positions covering [lo, hi] (about `target` ticks, steps of 1, 2 or 5 x 10^k).
std::vector<double> nice_ticks(double lo, double hi, int target);

// Escapes &, <, >, " for XML text and attributes.
std::string xml_escape(const std::string& s);

}  // namespace pagoda::sim
