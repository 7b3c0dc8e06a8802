#pragma once

// The dashboard's static files, compiled into cohortd (nothing is fetched at run time): one HTML
// shell for every page (dashboard.js picks the view from the path), its script and its style
// sheet. Chart.js is not here: it is Debian's libjs-chart.js, read from disk (dashboard.h).

#include <string>

namespace cohort::http {

const std::string& dashboard_page_html();
const std::string& dashboard_js();
const std::string& dashboard_css();

}  // namespace cohort::http
