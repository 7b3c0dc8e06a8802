#include "bench/sweep_flags.h"

#include "bench/bench_table.h"

namespace cohort::bench {

SweepFlags::SweepFlags(CLI::App* app, SweepOptions* sweep) : sweep_(sweep) {
  app->add_option("-b", begin_, "smallest message in bytes, e.g. 8, 64K, 64M")->type_name("SIZE")->capture_default_str();
  app->add_option("-e", end_, "largest message in bytes")->type_name("SIZE")->capture_default_str();
  app->add_option("-f", sweep->factor, "multiply the size by FACTOR each row")
      ->type_name("FACTOR")
      ->check(CLI::Range(size_t{2}, size_t{1} << 20))
      ->capture_default_str();
  app->add_option("--sizes", sweep->sizes, "exactly these sizes instead of -b/-e/-f, e.g. 8,1K,64K,1M,16M,64M")
      ->type_name("LIST");
  app->add_option("-n,--iters", sweep->iters, "timed calls per size, x10 at <= 64 KiB")
      ->type_name("ITERS")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("-w,--warmup", sweep->warmup, "untimed calls per size")
      ->type_name("WARMUP")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
}

std::string SweepFlags::finish() const {
  if (!parse_size(begin_, &sweep_->begin)) return "-b '" + begin_ + "' is not a size such as 8, 64K, 64M";
  if (!parse_size(end_, &sweep_->end)) return "-e '" + end_ + "' is not a size such as 8, 64K, 64M";
  return "";
}

}  // namespace cohort::bench
