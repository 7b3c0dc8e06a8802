#include "worker/base/credentials_file.h"

#include <gtest/gtest.h>

namespace cohort {
namespace {

TEST(CredentialsFileTest, RoundTripsThroughYaml) {
  Credentials in;
  in.coordinator = "10.0.0.1:7070";
  in.ca_certificate = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
  in.token = "abc123";
  StatusOr<Credentials> out = parse_credentials(format_credentials(in), "x");
  ASSERT_TRUE(out.ok()) << out.status().to_string();
  EXPECT_EQ(out->coordinator, in.coordinator);
  EXPECT_EQ(out->ca_certificate, in.ca_certificate);
  EXPECT_EQ(out->token, in.token);
}

TEST(CredentialsFileTest, NamesMissingAndUnknownKeys) {
  StatusOr<Credentials> missing = parse_credentials("coordinator: a:1\ntoken: t\n", "creds.yaml");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("creds.yaml: ca_certificate is missing"), std::string::npos)
      << missing.status().message();
  StatusOr<Credentials> unknown =
      parse_credentials("coordinator: a:1\nca_certificate: x\ntoken: t\npassword: p\n", "creds.yaml");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("creds.yaml:4: unknown key \"password\""), std::string::npos)
      << unknown.status().message();
  EXPECT_FALSE(parse_credentials("- a\n- b\n", "c").ok());
  EXPECT_FALSE(parse_credentials("{{{", "c").ok());
}

TEST(CredentialsFileTest, MissingFileSaysHowToGetOne) {
  StatusOr<Credentials> none = load_credentials("/nonexistent/creds");
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find("cohort user add"), std::string::npos);
}

}  // namespace
}  // namespace cohort
