#include "daemon/security/cluster_ca.h"

#include <sys/stat.h>

#include <gtest/gtest.h>

#include "daemon/coordinator/temp_dir.h"

namespace cohort::security {
namespace {

TEST(ClusterCaTest, CreatesOnceWithPrivateModesAndSignsCsrs) {
  coordinator::testing::TempDir dir;
  const std::string ca_dir = dir.path() + "/ca";
  StatusOr<ClusterCa> ca = ClusterCa::load_or_create(ca_dir);
  ASSERT_TRUE(ca.ok()) << ca.status().to_string();
  struct stat info {};
  ASSERT_EQ(::stat(ca_dir.c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0700u);
  ASSERT_EQ(::stat((ca_dir + "/ca.key").c_str(), &info), 0);
  EXPECT_EQ(info.st_mode & 0777, 0600u);

  StatusOr<ClusterCa> again = ClusterCa::load_or_create(ca_dir);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->fingerprint(), ca->fingerprint());
  EXPECT_EQ(again->fingerprint().size(), 64u);

  StatusOr<KeyAndCsr> request = make_key_and_csr("node-a");
  ASSERT_TRUE(request.ok()) << request.status().to_string();
  StatusOr<IssuedCertificate> cert = again->sign_csr(request->csr_pem, "node-a", {"node-a"}, {});
  ASSERT_TRUE(cert.ok()) << cert.status().to_string();
  StatusOr<CertificateInfo> parsed = certificate_info(cert->certificate_pem);
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(parsed->common_name, "node-a");
  EXPECT_EQ(parsed->serial, cert->serial);
  EXPECT_FALSE(again->sign_csr("garbage", "node-a", {}, {}).ok());
}

TEST(ClusterCaTest, RefusesAHalfPresentCa) {
  coordinator::testing::TempDir dir;
  ASSERT_TRUE(ClusterCa::load_or_create(dir.path()).ok());
  ASSERT_EQ(::unlink((dir.path() + "/ca.crt").c_str()), 0);
  StatusOr<ClusterCa> ca = ClusterCa::load_or_create(dir.path());
  ASSERT_FALSE(ca.ok());
  EXPECT_EQ(ca.status().code(), StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace cohort::security
