// The cohort:// init method's URL checks, which fail before anything is dialled, and its error
// for a coordinator that is not there.

#include "worker/comm/init/cohort/cohort_init_method.h"

#include <chrono>
#include <string>

#include <gtest/gtest.h>

#include "worker/comm/init/init_options.h"

namespace cohort::comm {
namespace {

StatusOr<Bootstrap> resolve(const std::string& url, const std::string& node_id = "node-a") {
  EXPECT_TRUE(register_cohort_init_method().ok());
  InitOptions options = InitOptions::from_url(url);
  options.node_id = node_id;
  options.timeout = std::chrono::milliseconds(100);
  options.env = environment_from({});
  return resolve_init(options);
}

void expect_invalid(const std::string& url, const std::string& words) {
  StatusOr<Bootstrap> boot = resolve(url);
  EXPECT_EQ(boot.status().code(), StatusCode::kInvalidArgument) << url << ": " << boot.status().to_string();
  EXPECT_NE(boot.status().message().find(words), std::string::npos) << boot.status().message();
}

TEST(CohortInitMethodTest, RegistersTheSchemeOnce) {
  ASSERT_TRUE(register_cohort_init_method().ok());
  ASSERT_TRUE(register_cohort_init_method().ok());
  bool found = false;
  for (const std::string& scheme : init_method_schemes()) found |= scheme == "cohort";
  EXPECT_TRUE(found);
}

TEST(CohortInitMethodTest, MalformedUrlsNameThePartAtFault) {
  expect_invalid("cohort://127.0.0.1:7070?local_rank=0", "job id");
  expect_invalid("cohort://127.0.0.1:7070/a/b?local_rank=0", "job id");
  expect_invalid("cohort://127.0.0.1:7070/job-1?attempt=0&local_rank=0", "attempt");
  expect_invalid("cohort://127.0.0.1:7070/job-1?attempt=two&local_rank=0", "attempt");
  expect_invalid("cohort://127.0.0.1:7070/job-1", "local_rank");
  expect_invalid("cohort://no-port/job-1?local_rank=0", "no-port");
}

TEST(CohortInitMethodTest, AnAbsentCoordinatorIsAnErrorNamingTheCallNotAHang) {
  // Port 1 on loopback: nothing listens there.
  StatusOr<Bootstrap> boot = resolve("cohort://127.0.0.1:1/job-1?local_rank=0");
  ASSERT_FALSE(boot.ok());
  EXPECT_NE(boot.status().message().find("Rendezvous.Join to 127.0.0.1:1"), std::string::npos)
      << boot.status().to_string();
}

}  // namespace
}  // namespace cohort::comm
