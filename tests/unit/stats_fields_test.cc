// The statistics reach every surface from their one description (proto/job_stats_fields.h): every
// field of proto::JobStats, StageStats and DaemonStatus has a row (a proto field added without one
// fails here, which a copy of the schema with one more field proves below), and each surface a row
// names shows that figure — the metrics endpoint (RenderPrometheus), spdlctl --json (OperatorJson,
// what spdlctl prints) and the `spdlctl status` text (OperatorStatusText), and the client's final
// stats (JobStatsFromProto: client::JobStats::values and each stage's StageStats::values, from which
// Python's stats(), its stage dicts and spdl-client --json are written). A row whose surface drops
// it fails here.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <functional>
#include <set>
#include <sstream>
#include <string>

#include "ops/metrics.h"
#include "proto/job_stats_fields.h"
#include "spdl/control.h"

namespace spdl {
namespace {

using google::protobuf::FieldDescriptor;

// Gives every scalar field of `m` a value of its own, so that each figure can be told apart in the
// output: field i gets i + 2 (integers) or i + 2.5 (doubles), a bool true, a string field
// `text(field)`; a message field is left alone; a field of another type fails the test.
void FillScalars(google::protobuf::Message* m, const std::function<std::string(const FieldDescriptor*)>& text) {
  const google::protobuf::Descriptor* d = m->GetDescriptor();
  const google::protobuf::Reflection* r = m->GetReflection();
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->is_repeated()) continue;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_UINT64:
        r->SetUInt64(m, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        r->SetUInt32(m, f, i + 2);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        r->SetDouble(m, f, i + 2.5);
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        r->SetBool(m, f, true);
        break;
      case FieldDescriptor::CPPTYPE_MESSAGE:  // a message of its own table (JobSummary.stats): filled apart
        break;
      case FieldDescriptor::CPPTYPE_STRING:
        if (text) {
          r->SetString(m, f, text(f));
          break;
        }
        [[fallthrough]];
      default:
        FAIL(d->name() << " field " << f->name() << " has a type this test does not fill");
        break;
    }
  }
}

proto::JobSummary FilledJob() {
  proto::JobSummary j;
  j.set_job_id(3);
  j.set_uid(1000);
  j.set_rank(0);
  j.set_region_bytes(4096);
  proto::JobStats* s = j.mutable_stats();
  FillScalars(s, nullptr);
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

// The fields of message `d` that no row of `table` describes, but those in `not_rows` (labels and
// lists, which a table leaves out by design), in proto order.
std::vector<std::string> Undescribed(const google::protobuf::Descriptor* d, std::span<const proto::JobStatField> table,
                                     const std::set<std::string>& not_rows) {
  std::vector<std::string> out;
  for (int i = 0; i < d->field_count(); ++i) {
    const std::string& name = d->field(i)->name();
    if (not_rows.count(name)) continue;
    if (std::none_of(table.begin(), table.end(), [&](const auto& f) { return name == f.name; })) out.push_back(name);
  }
  return out;
}

// The fields each table leaves out by design (the lists and labels its header names).
const std::set<std::string> kJobNotRows = {"stages"};
const std::set<std::string> kStageNotRows = {"name", "kind"};
const std::set<std::string> kDaemonNotRows = {"daemon_version", "jobs", "gpu_devices", "streams"};
const std::set<std::string> kSummaryNotRows = {"source", "stats"};
const std::set<std::string> kStreamNotRows = {"name", "groups"};
const std::set<std::string> kGroupNotRows = {"name"};
const std::set<std::string> kGpuNotRows = {"device", "error"};

TEST_CASE("a proto stats field added without a row is caught, in each of the seven messages") {
  // control.proto as built, and a copy with one more field in each stats message: the check that
  // guards the real schema (below) finds exactly the new field, and nothing in the real one.
  google::protobuf::FileDescriptorProto file;
  proto::JobStats::descriptor()->file()->CopyTo(&file);
  for (auto& m : *file.mutable_message_type()) {
    static const std::set<std::string> kTables = {"JobStats",     "StageStats",        "DaemonStatus",   "JobSummary",
                                                  "StreamStatus", "StreamGroupStatus", "GpuDeviceStatus"};
    if (!kTables.count(m.name())) continue;
    int number = 0;
    for (const auto& f : m.field()) number = std::max(number, f.number());
    auto* f = m.add_field();
    f->set_name("a_new_figure");
    f->set_number(number + 1);
    f->set_type(google::protobuf::FieldDescriptorProto::TYPE_UINT64);
    f->set_label(google::protobuf::FieldDescriptorProto::LABEL_OPTIONAL);
  }
  google::protobuf::DescriptorPool pool;
  const google::protobuf::FileDescriptor* grown = pool.BuildFile(file);
  REQUIRE(grown != nullptr);
  const std::vector<std::string> one = {"a_new_figure"};
  CHECK(Undescribed(grown->FindMessageTypeByName("JobStats"), proto::JobStatFields(), kJobNotRows) == one);
  CHECK(Undescribed(grown->FindMessageTypeByName("StageStats"), proto::StageStatFields(), kStageNotRows) == one);
  CHECK(Undescribed(grown->FindMessageTypeByName("DaemonStatus"), proto::DaemonStatFields(), kDaemonNotRows) == one);
  CHECK(Undescribed(grown->FindMessageTypeByName("JobSummary"), proto::JobSummaryFields(), kSummaryNotRows) == one);
  CHECK(Undescribed(grown->FindMessageTypeByName("StreamStatus"), proto::StreamStatFields(), kStreamNotRows) == one);
  CHECK(Undescribed(grown->FindMessageTypeByName("StreamGroupStatus"), proto::StreamGroupStatFields(), kGroupNotRows) ==
        one);
  CHECK(Undescribed(grown->FindMessageTypeByName("GpuDeviceStatus"), proto::GpuDeviceStatFields(), kGpuNotRows) == one);
  CHECK(Undescribed(proto::JobSummary::descriptor(), proto::JobSummaryFields(), kSummaryNotRows).empty());
  CHECK(Undescribed(proto::StreamStatus::descriptor(), proto::StreamStatFields(), kStreamNotRows).empty());
  CHECK(Undescribed(proto::StreamGroupStatus::descriptor(), proto::StreamGroupStatFields(), kGroupNotRows).empty());
  CHECK(Undescribed(proto::GpuDeviceStatus::descriptor(), proto::GpuDeviceStatFields(), kGpuNotRows).empty());
  CHECK(Undescribed(proto::JobStats::descriptor(), proto::JobStatFields(), kJobNotRows).empty());
  CHECK(Undescribed(proto::StageStats::descriptor(), proto::StageStatFields(), kStageNotRows).empty());
  CHECK(Undescribed(proto::DaemonStatus::descriptor(), proto::DaemonStatFields(), kDaemonNotRows).empty());
}

TEST_CASE("every JobStats field is described once, and every description names a JobStats field") {
  const google::protobuf::Descriptor* d = proto::JobStats::descriptor();
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (!kJobNotRows.count(d->field(i)->name())) proto_fields.push_back(d->field(i)->name());
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
  FillScalars(&st, [](const FieldDescriptor* f) { return f->name() == "name" ? "decode" : "cpu"; });
  for (int b = 0; b < 128; ++b) st.add_task_histogram(b == 40 ? 5 : 0);
  return st;
}

TEST_CASE("every StageStats field is described once (but its labels), and every description names one") {
  const google::protobuf::Descriptor* d = proto::StageStats::descriptor();
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (!kStageNotRows.count(d->field(i)->name())) proto_fields.push_back(d->field(i)->name());
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
    // A repeated field (the histogram) has no one value for the client.
    if (f.surfaces & proto::kClient) CHECK(std::string(f.type) != "histogram");
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

TEST_CASE("each stage of the client's final stats carries every stage statistic described for clients") {
  proto::JobSummary job = FilledJob();
  *job.mutable_stats()->add_stages() = FilledStage();
  const proto::StageStats& st = job.stats().stages(0);
  const client::JobStats c = client::JobStatsFromProto(job.stats());
  REQUIRE(c.stages.size() == 1);
  const client::StageStats& s = c.stages[0];
  CHECK(s.name == "decode");
  CHECK(s.kind == "cpu");
  size_t at = 0;
  for (const auto& f : proto::StageStatFields()) {
    if (!(f.surfaces & proto::kClient)) continue;
    CAPTURE(f.name);
    REQUIRE(at < s.values.size());
    CHECK(s.values[at].name == f.name);
    CHECK(s.values[at].value == proto::StageStatValue(st, f));
    CHECK(s.values[at].value != 0);  // FilledStage gave it a value of its own
    CHECK(s.values[at].integer == proto::StatIsInteger(st, f));
    ++at;
  }
  CHECK(at == s.values.size());
  CHECK(at >= 20);  // the lifetime and window figures
  // The typed fields are views of those values.
  CHECK(s.tasks == st.tasks());
  CHECK(s.failures == st.failures());
  CHECK(s.busy_seconds == st.busy_seconds());
  CHECK(s.avg_ms == st.avg_ms());
  CHECK(s.p50_ms == st.p50_ms());
  CHECK(s.p90_ms == st.p90_ms());
  CHECK(s.p99_ms == st.p99_ms());
  CHECK(s.put_wait_seconds == st.put_wait_seconds());
  CHECK(s.get_wait_seconds == st.get_wait_seconds());
  CHECK(s.items_per_s == st.items_per_s());
  // And the job's typed fields of theirs.
  const proto::JobStats& js = job.stats();
  CHECK(c.samples == js.samples());
  CHECK(c.batches == js.batches());
  CHECK(c.skipped == js.skipped());
  CHECK(c.seconds == js.seconds());
  CHECK(c.first_batch_seconds == js.first_batch_seconds());
  CHECK(c.client_wait_seconds == js.client_wait_seconds());
  CHECK(c.cache_hits == js.cache_hits());
  CHECK(c.cache_misses == js.cache_misses());
  CHECK(c.cache_evictions == js.cache_evictions());
  CHECK(c.cache_bytes == js.cache_bytes());
  CHECK(c.cache_budget_bytes == js.cache_budget_bytes());
}

// A daemon status whose every scalar field has a value of its own, like FilledJob's.
proto::DaemonStatus FilledStatus() {
  proto::DaemonStatus st;
  FillScalars(&st, [](const FieldDescriptor*) { return std::string("9.8.7"); });
  return st;
}

TEST_CASE("every DaemonStatus field is described once (but its label and lists), and every description names one") {
  const google::protobuf::Descriptor* d = proto::DaemonStatus::descriptor();
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    if (!kDaemonNotRows.count(d->field(i)->name())) proto_fields.push_back(d->field(i)->name());
  }
  std::vector<std::string> described;
  std::set<std::string> metrics;
  for (const auto& f : proto::DaemonStatFields()) {
    CAPTURE(f.name);
    described.push_back(f.name);
    const std::string type = f.type;
    CHECK((type == "counter" || type == "gauge"));
    CHECK(std::string(f.help).size() > 10);
    CHECK(std::string(f.unit).size() > 0);
    CHECK((f.surfaces & proto::kClient) == 0);  // no client surface asks for the daemon's status
    CHECK(f.per == nullptr);
    CHECK(((f.surfaces & proto::kMetrics) != 0) == (std::string(f.metric).size() > 0));
    if (f.surfaces & proto::kMetrics) {
      CHECK(metrics.insert(f.metric).second);
      CHECK(std::string(f.metric).rfind("spdld_", 0) == 0);
      CHECK(std::string(f.metric).rfind("spdld_job_", 0) != 0);  // not to be taken for a job's series
      CHECK(std::string(f.metric).rfind("spdld_stage_", 0) != 0);
      if (type == "counter") CHECK_THAT(std::string(f.metric), Catch::EndsWith("_total"));
    }
    CHECK(proto::FindDaemonStatField(f.name) == &f);
    CHECK(proto::FindJobStatField(f.name) == nullptr);  // the tables do not mix
    CHECK(proto::FindStageStatField(f.name) == nullptr);
  }
  CHECK(described == proto_fields);
  // The fields left out are the version (a label) and the lists.
  for (const std::string& name : kDaemonNotRows) {
    const FieldDescriptor* f = d->FindFieldByName(name);
    REQUIRE(f != nullptr);
    CHECK((f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_STRING));
  }
}

TEST_CASE("the metrics endpoint, spdlctl --json and spdlctl status show every daemon statistic described for them") {
  const proto::DaemonStatus status = FilledStatus();
  const std::string text = ops::RenderPrometheus(status);
  const std::string json = client::OperatorJson(status);
  const std::string table = client::OperatorStatusText(status);
  CHECK_THAT(text, Catch::Contains("spdld_build_info{version=\""));
  CHECK_THAT(table, Catch::StartsWith("spdld 9.8.7\n"));
  CHECK_THAT(table, Catch::Contains("GPU device memory leaked"));  // gpu_leaked_device_bytes > 0
  std::istringstream lines(table);
  for (std::string l; std::getline(lines, l);) CHECK(l.size() <= 100);
  for (const auto& f : proto::DaemonStatFields()) {
    CAPTURE(f.name, f.metric);
    const double v = proto::DaemonStatValue(status, f);
    CHECK(v != 0);  // FilledStatus gave it a value of its own
    if (f.surfaces & proto::kMetrics) {
      CHECK_THAT(text, Catch::Contains("# TYPE " + std::string(f.metric) + " " + f.type + "\n"));
      CHECK_THAT(text, Catch::Contains("\n" + std::string(f.metric) + " " + Number(v) + "\n"));
    }
    if (f.surfaces & proto::kSpdlctl) {
      CHECK_THAT(json, Catch::Contains("\"" + std::string(f.name) + "\":"));
    }
    if (f.surfaces & proto::kText) {
      // One line of the text: the name, then its value (an integer without a fraction).
      const std::string value = proto::StatIsInteger(status, f) ? std::to_string(static_cast<uint64_t>(v)) : [&] {
        char b[32];
        std::snprintf(b, sizeof(b), "%.1f", v);
        return std::string(b);
      }();
      const size_t line = table.find("  " + std::string(f.name) + " ");
      REQUIRE(line != std::string::npos);
      const std::string row = table.substr(line, table.find('\n', line) - line);
      CHECK_THAT(row, Catch::Contains(" " + value + " " + f.unit));
      CHECK(row.size() <= 100);
    }
  }
}

// The checks every table's rows pass (the job, stage and daemon tables have their own above): in
// proto order, each a field of `d` (but `not_rows`, which are labels, texts or lists), a known type,
// a help and a unit, a metric name iff the metrics show it (unique, starting with `prefix`, a
// counter's ending in _total), a column header only for spdlctl's text, no client surface.
void CheckTable(const google::protobuf::Descriptor* d, std::span<const proto::JobStatField> table,
                const std::set<std::string>& not_rows, const std::string& prefix,
                const proto::JobStatField* (*find)(std::string_view)) {
  std::vector<std::string> proto_fields;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (!not_rows.count(f->name())) {
      proto_fields.push_back(f->name());
      continue;
    }
    // What a table leaves out is a label or a text (a string), a list or a message of its own table.
    CHECK((f->is_repeated() || f->cpp_type() == FieldDescriptor::CPPTYPE_STRING ||
           f->cpp_type() == FieldDescriptor::CPPTYPE_MESSAGE));
  }
  std::vector<std::string> described;
  std::set<std::string> metrics, columns;
  for (const auto& f : table) {
    CAPTURE(d->name(), f.name);
    described.push_back(f.name);
    const std::string type = f.type, metric = f.metric;
    CHECK((type == "counter" || type == "gauge"));
    CHECK(std::string(f.help).size() > 10);
    CHECK(std::string(f.unit).size() > 0);
    CHECK((f.surfaces & proto::kClient) == 0);
    CHECK(f.surfaces != 0);
    CHECK(f.per == nullptr);
    CHECK(((f.surfaces & proto::kMetrics) != 0) == !metric.empty());
    if (f.surfaces & proto::kMetrics) {
      CHECK(metrics.insert(metric).second);
      CHECK(metric.rfind(prefix, 0) == 0);
      if (type == "counter") CHECK_THAT(metric, Catch::EndsWith("_total"));
      CHECK(proto::FindJobStatField(f.name) == nullptr);  // not to be taken for a job figure's series
    }
    CHECK((f.column == nullptr || (f.surfaces & proto::kText)));
    if (f.surfaces & proto::kText) {
      const std::string column = proto::StatColumn(f);
      CHECK(columns.insert(column).second);
      CHECK(column.find(' ') == std::string::npos);
    }
    const FieldDescriptor* field = d->FindFieldByName(f.name);
    REQUIRE(field != nullptr);
    CHECK_FALSE(field->is_repeated());
    CHECK(find(f.name) == &f);
  }
  CHECK(described == proto_fields);
}

TEST_CASE("every JobSummary, StreamStatus, StreamGroupStatus and GpuDeviceStatus field is described once") {
  CheckTable(proto::JobSummary::descriptor(), proto::JobSummaryFields(), kSummaryNotRows, "spdld_job_",
             proto::FindJobSummaryField);
  CheckTable(proto::StreamStatus::descriptor(), proto::StreamStatFields(), kStreamNotRows, "spdld_stream_",
             proto::FindStreamStatField);
  CheckTable(proto::StreamGroupStatus::descriptor(), proto::StreamGroupStatFields(), kGroupNotRows,
             "spdld_stream_group_", proto::FindStreamGroupStatField);
  CheckTable(proto::GpuDeviceStatus::descriptor(), proto::GpuDeviceStatFields(), kGpuNotRows, "spdld_gpu_device_",
             proto::FindGpuDeviceStatField);
  // A stream row's series is not taken for a group's (spdld_stream_group_* belongs to the groups).
  for (const auto& f : proto::StreamStatFields()) CHECK(std::string(f.metric).rfind("spdld_stream_group_", 0) != 0);
  // The metric names are an interface: these existed before the tables and keep their names.
  const std::set<std::string> kept = {"spdld_stream_retained_samples",
                                      "spdld_stream_retained_bytes",
                                      "spdld_stream_max_samples",
                                      "spdld_stream_max_bytes",
                                      "spdld_stream_put_samples_total",
                                      "spdld_stream_put_bytes_total",
                                      "spdld_stream_evicted_samples_total",
                                      "spdld_stream_blocked_puts_total",
                                      "spdld_stream_producers",
                                      "spdld_stream_group_lag_samples",
                                      "spdld_stream_group_consumers",
                                      "spdld_stream_group_in_flight_samples",
                                      "spdld_stream_group_redelivered_samples_total",
                                      "spdld_gpu_device_poisoned",
                                      "spdld_job_memory_bytes"};
  std::set<std::string> have;
  for (auto table : {proto::JobSummaryFields(), proto::StreamStatFields(), proto::StreamGroupStatFields(),
                     proto::GpuDeviceStatFields()}) {
    for (const auto& f : table) {
      if (f.surfaces & proto::kMetrics) have.insert(f.metric);
    }
  }
  CHECK(have == kept);
  // The job rows shown in `spdlctl jobs` are single values, with headers of their own.
  std::set<std::string> columns;
  for (const auto& f : proto::JobSummaryFields()) {
    if (f.surfaces & proto::kText) columns.insert(proto::StatColumn(f));
  }
  for (const auto& f : proto::JobStatFields()) {
    if (!(f.surfaces & proto::kText)) continue;
    CAPTURE(f.name);
    CHECK(f.per == nullptr);
    CHECK(std::string(f.name) != "client_wait_histogram");
    CHECK(columns.insert(proto::StatColumn(f)).second);
  }
  for (auto table : {proto::StageStatFields(), proto::DaemonStatFields()}) {
    for (const auto& f : table) CHECK(f.column == nullptr);  // lines of names, not columns
  }
  for (const auto& f : proto::StageStatFields()) CHECK((f.surfaces & proto::kText) == 0);  // `spdlctl stats`: a layout
}

// The whitespace-separated words of `line`.
std::vector<std::string> Words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

// The lines of `text`.
std::vector<std::string> Lines(const std::string& text) {
  std::istringstream in(text);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The cell under `header` in a table whose header line is `head` and row `row` (words apart).
std::string Cell(const std::string& head, const std::string& row, const std::string& header) {
  const std::vector<std::string> h = Words(head), r = Words(row);
  const auto at = std::find(h.begin(), h.end(), header);
  if (at == h.end() || static_cast<size_t>(at - h.begin()) >= r.size()) return "<no column " + header + ">";
  return r[static_cast<size_t>(at - h.begin())];
}

// How proto3 JSON (spdlctl --json) writes a scalar field of `m`: 64-bit integers as strings.
std::string JsonValue(const google::protobuf::Message& m, const proto::JobStatField& f) {
  const FieldDescriptor* d = m.GetDescriptor()->FindFieldByName(f.name);
  const double v = proto::StatValue(m, f);
  switch (d->cpp_type()) {
    case FieldDescriptor::CPPTYPE_UINT64:
    case FieldDescriptor::CPPTYPE_INT64:
      return "\"" + Number(v) + "\"";
    case FieldDescriptor::CPPTYPE_BOOL:
      return v != 0 ? "true" : "false";
    default:
      return Number(v);
  }
}

// A daemon status with a job, a stream with a consumer group and a GPU, every scalar field of each
// with a value of its own.
proto::DaemonStatus FilledWhole() {
  proto::DaemonStatus st = FilledStatus();
  proto::JobSummary* j = st.add_jobs();
  FillScalars(j, [](const FieldDescriptor*) { return std::string("/data/set"); });
  FillScalars(j->mutable_stats(), nullptr);
  proto::StreamStatus* s = st.add_streams();
  FillScalars(s, [](const FieldDescriptor*) { return std::string("frames"); });
  FillScalars(s->add_groups(), [](const FieldDescriptor*) { return std::string("train"); });
  FillScalars(st.add_gpu_devices(), [](const FieldDescriptor* f) {
    return f->name() == "device" ? std::string("cuda:0") : std::string("cudaErrorIllegalAddress (test)");
  });
  return st;
}

TEST_CASE("metrics, spdlctl --json and spdlctl's text show every job-summary, stream, group and GPU figure") {
  const proto::DaemonStatus st = FilledWhole();
  const proto::JobSummary& job = st.jobs(0);
  const proto::StreamStatus& stream = st.streams(0);
  const proto::StreamGroupStatus& group = stream.groups(0);
  const proto::GpuDeviceStatus& gpu = st.gpu_devices(0);
  const std::string text = ops::RenderPrometheus(st);
  const std::string json = client::OperatorJson(st);  // what spdlctl --json status|jobs|streams prints
  const std::string status = client::OperatorStatusText(st);
  const std::vector<std::string> jobs = Lines(client::OperatorJobsText(st));
  const std::vector<std::string> streams = Lines(client::OperatorStreamsText(st));
  INFO(status << client::OperatorJobsText(st) << client::OperatorStreamsText(st));
  REQUIRE(jobs.size() == 2);  // the header and the job (its source fits on the row)
  CHECK(Words(jobs[0]).back() == "SOURCE");
  CHECK(Words(jobs[1]).back() == "/data/set");
  REQUIRE(streams.size() == 3);  // the header, the stream, its group
  CHECK(Cell(streams[0], streams[1], "STREAM") == "frames");
  CHECK_THAT(streams[2], Catch::StartsWith("  group train "));
  for (const std::string& l : jobs) CHECK(l.size() <= 100);
  for (const std::string& l : streams) CHECK(l.size() <= 100);

  struct Case {
    const google::protobuf::Message* m;
    std::span<const proto::JobStatField> table;
    std::string labels;
  };
  const std::string job_labels = "{job_id=\"" + std::to_string(job.job_id()) + "\",uid=\"" + std::to_string(job.uid()) +
                                 "\",rank=\"" + std::to_string(job.rank()) + "\"}";
  const Case cases[] = {{&job, proto::JobSummaryFields(), job_labels},
                        {&stream, proto::StreamStatFields(), "{stream=\"frames\"}"},
                        {&group, proto::StreamGroupStatFields(), "{stream=\"frames\",group=\"train\"}"},
                        {&gpu, proto::GpuDeviceStatFields(), "{device=\"cuda:0\"}"}};
  for (const Case& c : cases) {
    for (const auto& f : c.table) {
      CAPTURE(c.m->GetDescriptor()->name(), f.name, f.metric);
      const double v = proto::StatValue(*c.m, f);
      CHECK(v != 0);  // the fill gave it a value of its own
      if (f.surfaces & proto::kMetrics) {
        CHECK_THAT(text, Catch::Contains("# TYPE " + std::string(f.metric) + " " + f.type + "\n"));
        CHECK_THAT(text, Catch::Contains("\n" + std::string(f.metric) + c.labels + " " + Number(v) + "\n"));
      }
      if (f.surfaces & proto::kSpdlctl) {
        CHECK_THAT(json, Catch::Contains("\"" + std::string(f.name) + "\": " + JsonValue(*c.m, f)));
      }
      if (!(f.surfaces & proto::kText)) continue;
      const std::string value = proto::StatText(*c.m, f);
      if (c.m == &job) {
        CHECK(Cell(jobs[0], jobs[1], proto::StatColumn(f)) == value);
      } else if (c.m == &stream) {
        CHECK(Cell(streams[0], streams[1], proto::StatColumn(f)) == value);
      } else if (c.m == &group) {
        CHECK_THAT(streams[2], Catch::Contains("  " + std::string(f.name) + " " + value + " ") ||
                                   Catch::EndsWith("  " + std::string(f.name) + " " + value));
      } else {
        const size_t line = status.find("  gpu cuda:0 ");
        REQUIRE(line != std::string::npos);
        const std::string row = status.substr(line, status.find('\n', line) - line);
        // Its figures start where the daemon lines' value fields do: "  " + 26 columns + " ".
        REQUIRE(row.size() > 29);
        CHECK(row[28] == ' ');
        CHECK(row[29] != ' ');
        CHECK_THAT(row, Catch::Contains("  " + std::string(f.name) + " " + value + " ") ||
                            Catch::EndsWith("  " + std::string(f.name) + " " + value));
        CHECK(row.size() <= 100);
      }
    }
  }
  // The job figures `spdlctl jobs` shows, in their columns.
  for (const auto& f : proto::JobStatFields()) {
    if (!(f.surfaces & proto::kText)) continue;
    CAPTURE(f.name);
    CHECK(Cell(jobs[0], jobs[1], proto::StatColumn(f)) == proto::StatText(job.stats(), f));
  }
  // Texts by their values: yes for a bool, the GPU's error in its alert.
  CHECK(Cell(streams[0], streams[1], "CLOSED") == "yes");
  CHECK_THAT(status, Catch::Contains("GPU cuda:0 POISONED: cudaErrorIllegalAddress (test); "));
  // Nothing to show: a line that says so.
  CHECK(client::OperatorStreamsText(proto::DaemonStatus()) == "no streams\n");
  CHECK_THAT(client::OperatorJobsText(proto::DaemonStatus()), Catch::EndsWith("SOURCE\nno jobs\n"));
}

TEST_CASE("spdlctl jobs puts a long source on a line of its own, cut in the middle past 100 columns") {
  proto::DaemonStatus st;
  proto::JobSummary* j = st.add_jobs();
  j->set_job_id(12);
  j->set_source("/data/" + std::string(200, 'x') + "/tail");
  const std::vector<std::string> lines = Lines(client::OperatorJobsText(st));
  REQUIRE(lines.size() == 3);
  CHECK(Cell(lines[0], lines[1], "JOB") == "12");
  CHECK_THAT(lines[2], Catch::StartsWith("        /data/xxx") && Catch::Contains("...") && Catch::EndsWith("x/tail"));
  for (const std::string& l : lines) CHECK(l.size() <= 100);
}

}  // namespace
}  // namespace spdl
