// The dashboard's static files (src/server/dashboard/), compiled into the
// binary by src/server/dashboard/embed.cmake as raw string literals.
#pragma once

namespace pagoda::server {

extern const char* const kDashboardHtml;  // index.html: the page, with /*@CSS@*/, /*@PLOTS_JS@*/, /*@APP_JS@*/
extern const char* const kDashboardJs;    // app.js: SSE client, grid, prefix tree, request table
extern const char* const kPlotsJs;        // plots.js: the time-series charts (page and reports)
extern const char* const kDashboardCss;   // style.css
extern const char* const kReportHtml;     // report.html: bench/sim report, with /*@CSS@*/, /*@PLOTS_JS@*/, /*@DATA@*/

}  // namespace pagoda::server
