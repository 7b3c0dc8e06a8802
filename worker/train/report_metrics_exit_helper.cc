// For report_metrics_test: reports two steps (the second one held by the rate limit) and returns
// from main without flush_metrics(), so the test sees whether the exit handler sends the held one.

#include "worker/train/report_metrics.h"

int main() {
  cohort::report_metrics({{"loss", 2.0}}, 1);
  cohort::report_metrics({{"loss", 1.0}}, 2);
  return 0;
}
