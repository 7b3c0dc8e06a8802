#include "worker/comm/init/init_url.h"

#include <gtest/gtest.h>

namespace cohort::comm {
namespace {

TEST(InitUrlTest, SplitsSchemeAuthorityPathAndQuery) {
  InitUrl url = parse_init_url("TCP://10.0.0.1:29500/?rank=1&world_size=4").value();
  EXPECT_EQ(url.scheme, "tcp");
  EXPECT_EQ(url.authority, "10.0.0.1:29500");
  EXPECT_EQ(url.path, "/");
  EXPECT_EQ(url.query, (std::map<std::string, std::string>{{"rank", "1"}, {"world_size", "4"}}));
  EXPECT_EQ(url.text, "TCP://10.0.0.1:29500/?rank=1&world_size=4");
}

TEST(InitUrlTest, EnvAndFileUrls) {
  InitUrl env = parse_init_url("env://").value();
  EXPECT_EQ(env.scheme, "env");
  EXPECT_TRUE(env.authority.empty());
  EXPECT_TRUE(env.path.empty());
  InitUrl file = parse_init_url("file:///shared/job%2042/store?rank=0").value();
  EXPECT_EQ(file.scheme, "file");
  EXPECT_TRUE(file.authority.empty());
  EXPECT_EQ(file.path, "/shared/job 42/store");
  EXPECT_EQ(file.query.at("rank"), "0");
}

TEST(InitUrlTest, RejectsAMissingScheme) {
  for (const char* text : {"", "localhost:29500", "://x", "1tcp://x"}) {
    Status status = parse_init_url(text).status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << text;
    EXPECT_NE(status.message().find("has no scheme"), std::string::npos) << status.message();
  }
}

TEST(InitUrlTest, RejectsMalformedQueriesAndEscapes) {
  Status no_value = parse_init_url("tcp://h:1?rank").status();
  EXPECT_NE(no_value.message().find("\"rank\" is not name=value"), std::string::npos) << no_value.message();
  Status twice = parse_init_url("tcp://h:1?rank=1&rank=2").status();
  EXPECT_NE(twice.message().find("given twice"), std::string::npos) << twice.message();
  Status escape = parse_init_url("file:///a%zz").status();
  EXPECT_NE(escape.message().find("percent-escape"), std::string::npos) << escape.message();
}

TEST(InitUrlTest, ParsesHostAndPort) {
  HostPort v4 = parse_host_port("node-01:29500", "u").value();
  EXPECT_EQ(v4.host, "node-01");
  EXPECT_EQ(v4.port, 29500);
  HostPort v6 = parse_host_port("[::1]:80", "u").value();
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 80);
}

TEST(InitUrlTest, RejectsBadHostPorts) {
  for (const char* authority :
       {"host", "host:", ":80", "host:0", "host:65536", "host:80x", "::1:80", "[::1]80"}) {
    Status status = parse_host_port(authority, "tcp://x").status();
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << authority;
    EXPECT_NE(status.message().find("tcp://x"), std::string::npos) << status.message();
  }
}

}  // namespace
}  // namespace cohort::comm
