// The job statistics reach every surface from their one description (proto/job_stats_fields.h):
// every proto::JobStats field has a row, and each surface a row names shows that figure — the
// metrics endpoint (RenderPrometheus), spdlctl --json (OperatorJson, what spdlctl prints), and the
// client's final stats (JobStatsFromProto: client::JobStats::values, from which Python's stats()
// and spdl-client --json are written). A field added to the proto without a row, or a row whose
// surface drops it, fails here.
#include <google/protobuf/descriptor.h>

#include <catch2/catch.hpp>
#include <set>
#include <sstream>
#include <string>

#include "ops/metrics.h"
#include "proto/job_stats_fields.h"
#include "spdl/control.h"

namespace spdl {
namespace {

using google::protobuf::FieldDescriptor;

// A job whose stats have every scalar field set to a value of its own: (index + 2), plus 0.5 for
// floating-point fields, so that each figure can be told apart in the output.
proto::JobSummary FilledJob() {
  proto::JobSummary j;
  j.set_job_id(3);
  j.set_uid(1000);
  j.set_rank(0);
  j.set_region_bytes(4096);
  proto::JobStats* s = j.mutable_stats();
  const google::protobuf::Descriptor* d = proto::JobStats::descriptor();
  const google::protobuf::Reflection* r = s->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(s, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(s, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(s, f, i + 2.5);
        break;
      default:
        FAIL("JobStats field " << f->name() << " has a type this test does not fill");
        break;
    }
  }
  for (int b = 0; b < 128; ++b) s->add_client_wait_histogram(b == 60 ? 3 : 0);
  s->add_source_samples(70);  // a mix of two sources
  s->add_source_samples(30);
  return j;
}

std::string Number(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}

TEST_CASE("every JobStats field is described once, and every description names a JobStats field") {
  const google::protobuf::Descriptor* d = proto::JobStats::descriptor();
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->name() != "stages") proto_fields.push_back(d->field(i)->name());
  }
  std::vector<std::string> described;
  std::set<std::string> metrics;
  for (const auto& f : proto::JobStatFields()) {
    CAPTURE(f.name);
    described.push_back(f.name);
    const std::string type = f.type;
    CHECK((type == "counter" || type == "gauge" || type == "histogram"));
    CHECK(std::string(f.help).size() > 10);
    CHECK(std::string(f.unit).size() > 0);
    CHECK(((f.surfaces & proto::kMetrics) != 0) == (std::string(f.metric).size() > 0));
    if (f.surfaces & proto::kMetrics) {
      CHECK(metrics.insert(f.metric).second);  // one series per figure
      CHECK(std::string(f.metric).rfind("spdld_", 0) == 0);
      if (type == "counter") CHECK(std::string(f.metric).size() > 6);
    }
    CHECK(proto::FindJobStatField(f.name) == &f);
  }
  // In proto order, so the surfaces list them in a stable order.
  CHECK(described == proto_fields);
}

TEST_CASE("the metrics endpoint shows every job statistic described for it, with its value") {
  proto::DaemonStatus status;
  *status.add_jobs() = FilledJob();
  const proto::JobStats& s = status.jobs(0).stats();
  const std::string text = ops::RenderPrometheus(status);
  const std::string labels = "{job_id=\"3\",uid=\"1000\",rank=\"0\"}";
  for (const auto& f : proto::JobStatFields()) {
    if (!(f.surfaces & proto::kMetrics)) continue;
    CAPTURE(f.name, f.metric);
    const std::string metric = f.metric;
    if (f.per != nullptr) {  // a repeated count: a series per entry, labelled by its index
      const std::vector<double> values = proto::JobStatValues(s, f);
      REQUIRE(values.size() == 2);
      CHECK_THAT(text, Catch::Contains("# TYPE " + metric + " " + f.type + "\n"));
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string l = labels.substr(0, labels.size() - 1) + "," + f.per + "=\"" + std::to_string(i) + "\"}";
        CHECK_THAT(text, Catch::Contains(metric + l + " " + Number(values[i]) + "\n"));
      }
    } else if (std::string(f.type) == "histogram") {
      // The client-wait histogram: its buckets, and its sum (client_wait_seconds).
      if (std::string(f.name) == "client_wait_histogram") {
        CHECK_THAT(text, Catch::Contains("# TYPE " + metric + " histogram\n"));
        CHECK_THAT(text, Catch::Contains(metric + "_count" + labels + " 3\n"));
      } else {
        CHECK_THAT(text, Catch::Contains(metric + labels + " " + Number(proto::JobStatValue(s, f)) + "\n"));
      }
    } else if (metric.rfind("spdld_cache_", 0) == 0 || metric.rfind("spdld_shard_cache_", 0) == 0) {  // node-wide
      CHECK_THAT(text, Catch::Contains("# TYPE " + metric + " " + f.type + "\n"));
      CHECK_THAT(text, Catch::Contains(metric + " " + Number(proto::JobStatValue(s, f)) + "\n"));
    } else {
      CHECK_THAT(text, Catch::Contains("# TYPE " + metric + " " + f.type + "\n"));
      CHECK_THAT(text, Catch::Contains(metric + labels + " " + Number(proto::JobStatValue(s, f)) + "\n"));
    }
  }
}

TEST_CASE("spdlctl --json shows every job statistic described for it") {
  const proto::JobSummary job = FilledJob();
  const std::string json = client::OperatorJson(job);
  for (const auto& f : proto::JobStatFields()) {
    if (!(f.surfaces & proto::kSpdlctl)) continue;
    CAPTURE(f.name);
    CHECK_THAT(json, Catch::Contains("\"" + std::string(f.name) + "\":"));
  }
  // Zeros too: a job that has skipped nothing still says so.
  proto::JobSummary empty;
  empty.mutable_stats();
  CHECK_THAT(client::OperatorJson(empty), Catch::Contains("\"skipped\": "));
}

TEST_CASE("the client's final stats carry every job statistic described for clients, by name and value") {
  const proto::JobSummary job = FilledJob();
  const client::JobStats c = client::JobStatsFromProto(job.stats());
  size_t at = 0;
  for (const auto& f : proto::JobStatFields()) {
    if (!(f.surfaces & proto::kClient)) continue;
    CAPTURE(f.name);
    if (f.per != nullptr) {  // NAME.0, NAME.1, ...: one value per entry
      const std::vector<double> values = proto::JobStatValues(job.stats(), f);
      REQUIRE(values.size() == 2);
      for (size_t i = 0; i < values.size(); ++i, ++at) {
        REQUIRE(at < c.values.size());
        CHECK(c.values[at].name == std::string(f.name) + "." + std::to_string(i));
        CHECK(c.values[at].value == values[i]);
        CHECK(c.values[at].integer);
      }
      continue;
    }
    REQUIRE(at < c.values.size());
    CHECK(c.values[at].name == f.name);
    CHECK(c.values[at].value == proto::JobStatValue(job.stats(), f));
    CHECK(c.values[at].integer == proto::JobStatIsInteger(f));
    ++at;
  }
  CHECK(at == c.values.size());
  // The typed fields agree with the named values.
  CHECK(c.samples == job.stats().samples());
  CHECK(c.cache_budget_bytes == job.stats().cache_budget_bytes());
  CHECK(c.client_wait_seconds == job.stats().client_wait_seconds());
  CHECK(c.source_samples == std::vector<uint64_t>{70, 30});
}

// A stage whose every scalar field has a value of its own, like FilledJob's.
proto::StageStats FilledStage() {
  proto::StageStats st;
  const google::protobuf::Descriptor* d = proto::StageStats::descriptor();
  const google::protobuf::Reflection* r = st.GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(&st, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(&st, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(&st, f, i + 2.5);
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        r->SetString(&st, f, f->name() == "name" ? "decode" : "cpu");
        break;
      default:
        FAIL("StageStats field " << f->name() << " has a type this test does not fill");
        break;
    }
  }
  for (int b = 0; b < 128; ++b) st.add_task_histogram(b == 40 ? 5 : 0);
  return st;
}

TEST_CASE("every StageStats field is described once (but its labels), and every description names one") {
  const google::protobuf::Descriptor* d = proto::StageStats::descriptor();
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (d->field(i)->name() != "name" && d->field(i)->name() != "kind") proto_fields.push_back(d->field(i)->name());
  }
  std::vector<std::string> described;
  std::set<std::string> metrics;
  for (const auto& f : proto::StageStatFields()) {
    CAPTURE(f.name);
    described.push_back(f.name);
    const std::string type = f.type;
    CHECK((type == "counter" || type == "gauge" || type == "histogram"));
    CHECK(std::string(f.help).size() > 10);
    CHECK(std::string(f.unit).size() > 0);
    CHECK((f.surfaces & proto::kClient) == 0);  // the client's stage struct is still typed by hand
    CHECK(((f.surfaces & proto::kMetrics) != 0) == (std::string(f.metric).size() > 0));
    if (f.surfaces & proto::kMetrics) {
      CHECK(metrics.insert(f.metric).second);
      CHECK(std::string(f.metric).rfind("spdld_stage_", 0) == 0);
    }
    CHECK(proto::FindStageStatField(f.name) == &f);
    CHECK(proto::FindJobStatField(f.name) == nullptr);  // the two tables do not mix
  }
  CHECK(described == proto_fields);
}

TEST_CASE("the metrics endpoint and spdlctl --json show every stage statistic described for them") {
  proto::DaemonStatus status;
  proto::JobSummary* job = status.add_jobs();
  *job = FilledJob();
  *job->mutable_stats()->add_stages() = FilledStage();
  const proto::StageStats& st = job->stats().stages(0);
  const std::string text = ops::RenderPrometheus(status);
  const std::string labels = "{job_id=\"3\",stage=\"decode\"}";
  const std::string json = client::OperatorJson(*job);
  for (const auto& f : proto::StageStatFields()) {
    CAPTURE(f.name, f.metric);
    if (f.surfaces & proto::kMetrics) {
      const std::string metric = f.metric;
      CHECK_THAT(text, Catch::Contains("# TYPE " + metric + " " + f.type + "\n"));
      if (std::string(f.type) == "histogram") {
        CHECK_THAT(text, Catch::Contains(metric + "_count" + labels + " 5\n"));
        CHECK_THAT(text, Catch::Contains(metric + "_sum" + labels + " " + Number(st.busy_seconds()) + "\n"));
      } else {
        CHECK_THAT(text, Catch::Contains(metric + labels + " " + Number(proto::StageStatValue(st, f)) + "\n"));
      }
    }
    if (f.surfaces & proto::kSpdlctl) CHECK_THAT(json, Catch::Contains("\"" + std::string(f.name) + "\":"));
  }
}

}  // namespace
}  // namespace spdl
