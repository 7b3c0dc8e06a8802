#pragma once

// cohort's one version string, printed by every binary's --version.
namespace cohort {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace cohort
