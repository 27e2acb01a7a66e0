// Unit tests of the S3 pieces that need no server: s3:// URL parsing, the request URL builder
// (path-style and virtual-hosted addressing; virtual-hosted is checked here on the URL only, since a
// bucket host name under 127.0.0.1 does not resolve), the allowed-prefix rule, option checks, and the
// client's shared-credentials-file parser. The transport itself is tested against a real S3 server
// (moto) in tests/python/test_s3.py.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "config/job_config.h"
#include "io/s3_client.h"
#include "s3_access.h"

using spdl::io::ParseS3Url;
using spdl::io::S3Addressing;
using spdl::io::S3Client;
using spdl::io::S3Location;
using spdl::io::S3Options;

TEST_CASE("s3 URLs parse into bucket and key, bad bucket names are refused") {
  auto a = ParseS3Url("s3://my-bucket/train/shard-000.tar");
  REQUIRE(a.ok());
  CHECK(a->bucket == "my-bucket");
  CHECK(a->key == "train/shard-000.tar");
  CHECK(a->ToString() == "s3://my-bucket/train/shard-000.tar");
  auto b = ParseS3Url("s3://bucket");
  REQUIRE(b.ok());
  CHECK(b->key.empty());
  CHECK_FALSE(ParseS3Url("http://bucket/x").ok());
  CHECK_FALSE(ParseS3Url("s3://Bad_Bucket/x").ok());
  CHECK_FALSE(ParseS3Url("s3://ab/x").ok());
  CHECK_FALSE(ParseS3Url("s3://a..b/x").ok());
  CHECK_FALSE(ParseS3Url("s3://bucket/a\nb").ok());
  CHECK_FALSE(ParseS3Url("s3://evil.com:80@bucket/x").ok());
}

namespace {
std::unique_ptr<S3Client> Make(S3Options o) {
  auto c = S3Client::Create(std::move(o));
  REQUIRE(c.ok());
  return std::move(c).value();
}
}  // namespace

TEST_CASE("s3 request URLs: path-style for an endpoint, virtual-hosted for AWS, keys encoded") {
#if SPDL_IO_HAVE_CURL
  S3Options o;
  o.endpoint_url = "http://127.0.0.1:9000";
  o.allowed_url_prefixes = {"http://127.0.0.1:9000/data"};
  auto path_style = Make(o);
  auto url = path_style->ObjectUrl(S3Location{"data", "train/a b+c.jpg"});
  REQUIRE(url.ok());
  CHECK(*url == "http://127.0.0.1:9000/data/train/a%20b%2Bc.jpg");
  // Another bucket on the same endpoint is not below the prefix.
  auto other = path_style->ObjectUrl(S3Location{"database", "x"});
  REQUIRE_FALSE(other.ok());
  CHECK(other.status().code() == spdl::StatusCode::kPermissionDenied);
  CHECK(other.status().message().find("s3://database/x") != std::string::npos);

  S3Options v = o;
  v.addressing = S3Addressing::kVirtual;
  v.endpoint_url = "http://s3.local:9000";
  v.allowed_url_prefixes = {"http://data.s3.local:9000/"};
  auto vhost = Make(v);
  url = vhost->ObjectUrl(S3Location{"data", "k/1.tar"});
  REQUIRE(url.ok());
  CHECK(*url == "http://data.s3.local:9000/k/1.tar");

  S3Options aws;
  aws.region = "eu-west-1";
  aws.allowed_url_prefixes = {"https://data.s3.eu-west-1.amazonaws.com"};
  auto a = Make(aws);
  url = a->ObjectUrl(S3Location{"data", "x.tar"});
  REQUIRE(url.ok());
  CHECK(*url == "https://data.s3.eu-west-1.amazonaws.com/x.tar");
  CHECK(a->endpoint() == "https://s3.eu-west-1.amazonaws.com");
  // Dotted bucket names cannot be virtual-hosted over TLS.
  CHECK_FALSE(a->ObjectUrl(S3Location{"my.data", "x"}).ok());
#else
  SKIP("built without libcurl");
#endif
}

TEST_CASE("s3 options are checked, and no allowed prefix refuses everything") {
#if SPDL_IO_HAVE_CURL
  S3Options o;
  o.endpoint_url = "http://127.0.0.1:9000";
  auto none = S3Client::Create(o);
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == spdl::StatusCode::kPermissionDenied);
  o.allowed_url_prefixes = {"http://127.0.0.1:9000/"};
  o.max_attempts = 0;
  CHECK(S3Client::Create(o).status().code() == spdl::StatusCode::kInvalidArgument);
  o.max_attempts = 2;
  o.region = "us-east-1; rm";
  CHECK(S3Client::Create(o).status().code() == spdl::StatusCode::kInvalidArgument);
  o.region = "us-east-1";
  o.endpoint_url = "ftp://127.0.0.1/";
  CHECK(S3Client::Create(o).status().code() == spdl::StatusCode::kInvalidArgument);
  o.endpoint_url = "http://user:pw@127.0.0.1/";
  CHECK(S3Client::Create(o).status().code() == spdl::StatusCode::kInvalidArgument);
#else
  SKIP("built without libcurl");
#endif
}

TEST_CASE("the shared credentials file: the profile's keys only") {
  const std::string text =
      "# comment\n[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key=secret/default+\n\n"
      "[train]\n  aws_access_key_id=AKIDTRAIN  \naws_secret_access_key = s3cr=t\naws_session_token = tok\n";
  spdl::proto::S3Access a;
  spdl::client::ParseCredentialsFile(text, "default", &a);
  CHECK(a.access_key_id() == "AKIDDEFAULT");
  CHECK(a.secret_access_key() == "secret/default+");
  CHECK(a.session_token().empty());
  spdl::proto::S3Access t;
  spdl::client::ParseCredentialsFile(text, "train", &t);
  CHECK(t.access_key_id() == "AKIDTRAIN");
  CHECK(t.secret_access_key() == "s3cr=t");
  CHECK(t.session_token() == "tok");
  spdl::proto::S3Access n;
  spdl::client::ParseCredentialsFile(text, "nope", &n);
  CHECK(n.access_key_id().empty());
}

namespace {
std::string Errors(const spdl::config::JobConfigResult& r) {
  std::string all;
  for (const auto& e : r.errors) all += e.path + ": " + e.message + "\n";
  return all;
}
}  // namespace

TEST_CASE("job config: s3_prefix and the source's s3 map") {
  using spdl::config::ParseJobConfig;
  const std::string kFixed = "transforms: [{resize: {height: 8, width: 8}}]\n";
  auto r = ParseJobConfig(
      std::string("source: {type: s3_prefix, prefix: 's3://b-1/train/', extensions: [.jpg],\n"
                  "         s3: {endpoint_url: 'http://127.0.0.1:9000', region: eu-west-1, addressing: path,\n") +
      "              max_attempts: 7, timeout_ms: 1000, initial_backoff_ms: 5, max_backoff_ms: 10}}\n" + kFixed);
  INFO(Errors(r));
  REQUIRE(r.config);
  const auto& s = r.config->source;
  CHECK(s.type == spdl::config::SourceType::kS3Prefix);
  CHECK(s.UsesS3());
  CHECK(s.prefix == "s3://b-1/train/");
  CHECK(s.s3.endpoint_url == "http://127.0.0.1:9000");
  CHECK(s.s3.region == "eu-west-1");
  CHECK(s.s3.addressing == "path");
  CHECK(s.s3.max_attempts == 7);
  CHECK(s.s3.max_backoff_ms == 10);

  auto tar = ParseJobConfig("source: {type: tar, shards: 's3://b-1/s-{0..3}.tar'}\n" + kFixed);
  REQUIRE(tar.config);
  CHECK(tar.config->source.UsesS3());
  auto local = ParseJobConfig("source: {type: tar, shards: /data/s.tar}\n" + kFixed);
  REQUIRE(local.config);
  CHECK_FALSE(local.config->source.UsesS3());

  auto bad = ParseJobConfig("source: {type: s3_prefix, prefix: /data, s3: {addressing: sideways, bogus: 1}}\n");
  CHECK_FALSE(bad.config);
  const std::string all = Errors(bad);
  CHECK(all.find("must be an s3:// URL") != std::string::npos);
  CHECK(all.find("must be auto, path or virtual") != std::string::npos);
  CHECK(all.find("bogus") != std::string::npos);
  auto wrong_type = ParseJobConfig("source: {type: http, list: /l.txt, s3: {region: x}}\n");
  CHECK_FALSE(wrong_type.config);
  CHECK(Errors(wrong_type).find("not a key of source type http") != std::string::npos);
}

TEST_CASE("the client's S3 access: environment first, then the profile of the credentials file") {
  const std::string home = "/tmp/spdl-s3-test-home-" + std::to_string(::getpid());
  std::filesystem::create_directories(home + "/.aws");
  std::ofstream(home + "/.aws/credentials")
      << "[default]\naws_access_key_id=FILEKEY\naws_secret_access_key=FILESECRET\n"
      << "[other]\naws_access_key_id=OTHERKEY\naws_secret_access_key=OTHERSECRET\n";
  for (const char* v :
       {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE",
        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"}) {
    ::unsetenv(v);
  }
  spdl::proto::S3Access a;
  spdl::client::LoadS3Access(&a, home);
  CHECK(a.access_key_id() == "FILEKEY");
  CHECK(a.secret_access_key() == "FILESECRET");
  ::setenv("AWS_PROFILE", "other", 1);
  ::setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1", 1);
  ::setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:2", 1);
  ::setenv("AWS_DEFAULT_REGION", "eu-north-1", 1);
  spdl::client::LoadS3Access(&a, home);
  CHECK(a.access_key_id() == "OTHERKEY");
  CHECK(a.endpoint_url() == "http://127.0.0.1:2");
  CHECK(a.region() == "eu-north-1");
  ::setenv("AWS_ACCESS_KEY_ID", "ENVKEY", 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET", 1);
  ::setenv("AWS_SESSION_TOKEN", "ENVTOKEN", 1);
  spdl::client::LoadS3Access(&a, home);
  CHECK(a.access_key_id() == "ENVKEY");
  CHECK(a.session_token() == "ENVTOKEN");
  for (const char* v : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                        "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION"}) {
    ::unsetenv(v);
  }
  std::filesystem::remove_all(home);
  spdl::client::LoadS3Access(&a, home);  // no file, no environment: nothing
  CHECK(a.ByteSizeLong() == 0);
}

TEST_CASE("the client sends S3 access only with a job that may read s3://") {
  using spdl::client::JobMayUseS3;
  const std::string dir = "/tmp/spdl-s3-test-lists-" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/local.txt") << "a/1.jpg,0\nb/2.jpg,1\n";
  std::ofstream(dir + "/remote.txt") << "s3://bucket/a/1.jpg,0\n";
  CHECK_FALSE(JobMayUseS3("source: {type: image_folder, root: /data}\n", {}));
  CHECK(JobMayUseS3("source: {type: tar, shards: 's3://b/train-{0..3}.tar'}\n", {}));
  CHECK(JobMayUseS3("source:\n  type: s3_prefix\n  prefix: s3://b/train/\n", {}));
  CHECK(JobMayUseS3("source: {type: image_folder, root: /data}\n", {{"source.shards", "s3://b/x.tar"}}));
  // A list names s3:// only in its lines: read here as the trainer.
  CHECK_FALSE(JobMayUseS3("source: {type: file_list, list: " + dir + "/local.txt}\n", {}));
  CHECK(JobMayUseS3("source: {type: file_list, list: " + dir + "/remote.txt}\n", {}));
  CHECK(JobMayUseS3("source:\n  type: file_list\n  list: '" + dir + "/remote.txt'  # s3 lines\n", {}));
  CHECK(JobMayUseS3("sources:\n  - {type: file_list, list: " + dir + "/local.txt}\n  - {type: file_list, list: " + dir +
                        "/remote.txt, weight: 2}\n",
                    {}));
  CHECK(
      JobMayUseS3("source: {type: file_list, list: " + dir + "/local.txt}\n", {{"source.list", dir + "/remote.txt"}}));
  // A list that cannot be read here: the daemon may need the access.
  CHECK(JobMayUseS3("source: {type: file_list, list: " + dir + "/missing.txt}\n", {}));
  // A key merely ending in "list" is not a list file (e.g. blocklist: ...).
  CHECK_FALSE(JobMayUseS3("source: {type: image_folder, root: /data}\nblocklist: /nope\n", {}));
  std::filesystem::remove_all(dir);
}
