#include "config/yaml_reader.h"

#include <yaml-cpp/eventhandler.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <limits>
#include <sstream>

#include "common/ascii.h"

namespace spdl::config::internal {
namespace {

// Records where each document of a YAML stream starts, and nothing else.
class DocumentStarts : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override { starts.push_back(mark); }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark&, YAML::anchor_t) override {}
  void OnAlias(const YAML::Mark&, YAML::anchor_t) override {}
  void OnScalar(const YAML::Mark&, const std::string&, YAML::anchor_t, const std::string&) override {}
  void OnSequenceStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark&, const std::string&, YAML::anchor_t, YAML::EmitterStyle::value) override {}
  void OnMapEnd() override {}
  std::vector<YAML::Mark> starts;
};

std::string JoinPath(const std::string& parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  return parent + "." + std::string(key);
}

// A valid place to report, or a null mark.
YAML::Mark MarkOf(const YAML::Node& node) {
  if (!node.IsDefined()) return YAML::Mark::null_mark();
  return node.Mark();
}

// Edit distance counting an adjacent swap as one edit (optimal string alignment).
size_t EditDistance(const std::string& a, const std::string& b) {
  const size_t n = a.size(), m = b.size();
  std::vector<std::vector<size_t>> d(n + 1, std::vector<size_t>(m + 1));
  for (size_t i = 0; i <= n; ++i) d[i][0] = i;
  for (size_t j = 0; j <= m; ++j) d[0][j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    }
  }
  return d[n][m];
}

bool IsDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

std::vector<std::string> SplitPath(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot - start));
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return parts;
}

// Sets `value` at `path` in `root`, creating missing maps. Returns "" or what went wrong.
std::string ApplyOverride(YAML::Node& root, const std::string& path, const YAML::Node& value) {
  const std::vector<std::string> parts = SplitPath(path);
  for (const std::string& p : parts) {
    if (p.empty()) return "the path has an empty component";
  }
  YAML::Node cur;
  cur.reset(root);
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const std::string& part = parts[i];
    const bool last = i + 1 == parts.size();
    YAML::Node child;
    if (cur.IsSequence()) {
      if (!IsDigits(part)) {
        return "'" + (walked.empty() ? std::string("(the document)") : walked) + "' is a list; '" + part +
               "' is not an index";
      }
      size_t index = 0;
      const auto [ptr, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
      if (ec != std::errc() || index >= cur.size()) {
        return "index " + part + " is out of range: '" + walked + "' has " + std::to_string(cur.size()) + " item(s)";
      }
      if (last) {
        cur[index] = value;
        return "";
      }
      child.reset(cur[index]);
    } else if (cur.IsMap() || cur.IsNull()) {  // a null (empty) value becomes a map
      if (last) {
        cur[part] = value;
        return "";
      }
      child.reset(cur[part]);
      if (!child.IsDefined() || child.IsNull()) {
        cur[part] = YAML::Node(YAML::NodeType::Map);
        child.reset(cur[part]);
      }
    } else {
      return "'" + walked + "' is a single value (" + Describe(cur) + "), so it has no '" + part + "' inside";
    }
    walked = JoinPath(walked, part);
    cur.reset(child);
  }
  return "";
}

}  // namespace

Field RootField(const YAML::Node& root) {
  YAML::Mark mark = MarkOf(root);
  if (mark.is_null()) mark = YAML::Mark();  // line 0, column 0: reported as 1:1
  return Field{root, "", mark};
}

// ---- Diagnostics ----

Diagnostics::Diagnostics(std::vector<std::string> override_paths) : override_paths_(std::move(override_paths)) {}

bool Diagnostics::FromOverride(const std::string& path) const {
  for (const std::string& o : override_paths_) {
    if (path == o || (path.size() > o.size() && path.compare(0, o.size(), o) == 0 && path[o.size()] == '.')) {
      return true;
    }
  }
  return false;
}

void Diagnostics::Record(const Field& field, const YAML::Mark& mark, std::string message) {
  ConfigError e;
  if (FromOverride(field.path)) {
    e.path = "--set " + field.path;
  } else {
    e.path = field.path;
    if (!mark.is_null()) {
      e.line = mark.line + 1;
      e.column = mark.column + 1;
    }
  }
  e.message = std::move(message);
  errors_.push_back(std::move(e));
}

void Diagnostics::Error(const Field& field, std::string message) {
  YAML::Mark mark = field.key_mark;
  if (field.node.IsDefined() && !field.node.IsNull() && !field.node.Mark().is_null()) {
    mark = field.node.Mark();
  }
  Record(field, mark, std::move(message));
}

void Diagnostics::ErrorAtKey(const Field& field, std::string message) {
  Record(field, field.key_mark, std::move(message));
}

void Diagnostics::ErrorNoLine(std::string path, std::string message) {
  errors_.push_back(ConfigError{0, 0, std::move(path), std::move(message)});
}

void Diagnostics::ErrorAtMark(const YAML::Mark& mark, std::string message) {
  ConfigError e;
  if (!mark.is_null()) {
    e.line = mark.line + 1;
    e.column = mark.column + 1;
  }
  e.message = std::move(message);
  errors_.push_back(std::move(e));
}

std::vector<ConfigError> Diagnostics::Take() {
  std::stable_sort(errors_.begin(), errors_.end(), [](const ConfigError& a, const ConfigError& b) {
    if ((a.line == 0) != (b.line == 0)) return b.line == 0;  // errors without a line go last
    if (a.line != b.line) return a.line < b.line;
    return a.column < b.column;
  });
  return std::move(errors_);
}

// ---- loading ----

std::optional<YAML::Node> LoadDocument(std::string_view text, const std::vector<Override>& overrides,
                                       Diagnostics* diag) {
  // Not YAML::LoadAll: in yaml-cpp 0.7 it never returns on some inputs (a ',' at the top level:
  // the parser yields empty documents forever without consuming it, allocating as it goes — found
  // by tests/fuzz/config_fuzz, and any client could send it). The documents are walked here and
  // the walk stops when one starts where the previous one did; then the first one is loaded.
  DocumentStarts docs;
  YAML::Node first;
  try {
    std::istringstream in{std::string(text)};
    YAML::Parser parser(in);
    while (parser.HandleNextDocument(docs)) {
      const size_t n = docs.starts.size();
      if (n >= 2 && docs.starts[n - 1].pos <= docs.starts[n - 2].pos) {
        const YAML::Mark& m = docs.starts[n - 1];
        const char c = m.pos >= 0 && static_cast<size_t>(m.pos) < text.size() ? text[static_cast<size_t>(m.pos)] : '?';
        diag->ErrorAtMark(m, std::string("unexpected '") + c + "' outside any list or map");
        return std::nullopt;
      }
    }
    if (!docs.starts.empty()) first = YAML::Load(std::string(text));
  } catch (const YAML::ParserException& e) {
    diag->ErrorAtMark(e.mark, e.msg);
    return std::nullopt;
  }
  if (docs.starts.size() > 1) {
    diag->ErrorAtMark(docs.starts[1], "expected one YAML document, found " + std::to_string(docs.starts.size()) +
                                          " (remove the '---')");
  }
  // A real (not empty-handle) node, so that overrides can turn an empty document into a map.
  YAML::Node root = docs.starts.empty() ? YAML::Node(YAML::NodeType::Null) : first;
  for (const Override& o : overrides) {
    YAML::Node value;
    try {
      value = YAML::Load(o.value);
    } catch (const YAML::ParserException& e) {
      diag->ErrorNoLine("--set " + o.path, "the value '" + o.value + "' is not valid YAML: " + e.msg);
      continue;
    }
    std::string why = ApplyOverride(root, o.path, value);
    if (!why.empty()) diag->ErrorNoLine("--set " + o.path, "cannot set this path: " + why);
  }
  return root;
}

// ---- MapReader ----

MapReader::MapReader(Diagnostics& diag, Field field) : diag_(diag), field_(std::move(field)) {
  const YAML::Node& node = field_.node;
  if (!node.IsDefined() || node.IsNull()) return;
  if (!node.IsMap()) {
    diag_.Error(field_, "expected a map of settings, got " + Describe(node));
    ok_ = false;
    return;
  }
  for (auto it = node.begin(); it != node.end(); ++it) {
    // Copies: `it->first` lives in a temporary proxy, so a reference to it would dangle.
    const YAML::Node key = it->first;
    const YAML::Node value = it->second;
    if (!key.IsScalar()) {
      diag_.Error(Field{key, field_.path, MarkOf(key)}, "keys must be plain names, got " + Describe(key));
      continue;
    }
    Entry entry{key.Scalar(), Field{value, JoinPath(field_.path, key.Scalar()), MarkOf(key)}};
    bool duplicate = false;
    for (const Entry& e : entries_) {
      if (e.key == entry.key) {
        std::string where =
            e.field.key_mark.is_null() ? "" : " (first at line " + std::to_string(e.field.key_mark.line + 1) + ")";
        diag_.ErrorAtKey(entry.field, "duplicate key" + where);
        duplicate = true;
        break;
      }
    }
    if (!duplicate) entries_.push_back(std::move(entry));
  }
}

Field MapReader::Get(std::string_view key) {
  known_.emplace_back(key);
  for (Entry& e : entries_) {
    if (e.key == key) {
      e.used = true;
      return e.field;
    }
  }
  return Field{YAML::Node(YAML::NodeType::Undefined), JoinPath(field_.path, key), field_.key_mark};
}

Field MapReader::Require(std::string_view key) {
  Field f = Get(key);
  if (!Present(f) && ok_) diag_.ErrorAtKey(f, "required key is missing");
  return f;
}

void MapReader::ReportUnknownKeys() {
  for (const Entry& e : entries_) {
    if (e.used) continue;
    std::string message = "unknown key '" + e.key + "'";
    const std::string suggestion = Suggest(e.key, known_);
    if (!suggestion.empty()) message += " (did you mean '" + suggestion + "'?)";
    diag_.ErrorAtKey(e.field, std::move(message));
  }
}

// ---- value readers ----

std::string Describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing (null)";
  if (node.IsMap()) return "a map";
  if (node.IsSequence()) return "a list";
  std::string s = node.Scalar();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return "'" + s + "'";
}

std::string Suggest(std::string_view word, const std::vector<std::string>& candidates) {
  const std::string w = AsciiLower(word);
  const size_t limit = w.size() <= 3 ? 1 : 2;
  std::string best;
  size_t best_distance = limit + 1;
  bool tie = false;
  for (const std::string& c : candidates) {
    const size_t d = EditDistance(w, AsciiLower(c));
    if (d < best_distance) {
      best = c;
      best_distance = d;
      tie = false;
    } else if (d == best_distance && c != best) {
      tie = true;
    }
  }
  if (!best.empty() && !tie) return best;
  // A shortened or lengthened name ("max_slots" for "max_slots_per_job"): one candidate that
  // starts with the word, or that the word starts with.
  std::string prefix_match;
  for (const std::string& c : candidates) {
    const std::string lc = AsciiLower(c);
    const bool related = (w.size() >= 4 && lc.rfind(w, 0) == 0) || (lc.size() >= 4 && w.rfind(lc, 0) == 0);
    if (!related || c == prefix_match) continue;
    if (!prefix_match.empty()) return "";
    prefix_match = c;
  }
  return prefix_match;
}

std::optional<int64_t> ReadInt(Diagnostics& diag, const Field& f, int64_t min, int64_t max) {
  if (!Present(f)) return std::nullopt;
  if (!f.node.IsScalar()) {
    diag.Error(f, "expected an integer, got " + Describe(f.node));
    return std::nullopt;
  }
  const std::string& s = f.node.Scalar();
  std::string_view digits = s;
  if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
  int64_t value = 0;
  const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range) {
    diag.Error(f, "the integer " + Describe(f.node) + " is too large");
    return std::nullopt;
  }
  if (ec != std::errc() || ptr != digits.data() + digits.size() || digits.empty() || digits.front() == '+') {
    diag.Error(f, "expected an integer, got " + Describe(f.node));
    return std::nullopt;
  }
  if (value < min) {
    diag.Error(f, "must be at least " + std::to_string(min) + " (got " + std::to_string(value) + ")");
    return std::nullopt;
  }
  if (value > max) {
    diag.Error(f, "must be at most " + std::to_string(max) + " (got " + std::to_string(value) + ")");
    return std::nullopt;
  }
  return value;
}

std::optional<uint64_t> ReadUint64(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (f.node.IsScalar()) {
    std::string_view digits = f.node.Scalar();
    if (!digits.empty() && digits.front() == '+') digits.remove_prefix(1);
    uint64_t value = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
    if (ec == std::errc() && ptr == digits.data() + digits.size() && IsDigits(digits)) return value;
    if (ec == std::errc::result_out_of_range) {
      diag.Error(f, "the integer " + Describe(f.node) + " is too large (at most " +
                        std::to_string(std::numeric_limits<uint64_t>::max()) + ")");
      return std::nullopt;
    }
  }
  diag.Error(f, "expected a non-negative integer, got " + Describe(f.node));
  return std::nullopt;
}

std::optional<bool> ReadBool(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  bool value = false;
  if (f.node.IsScalar() && YAML::convert<bool>::decode(f.node, value)) return value;
  diag.Error(f, "expected true or false, got " + Describe(f.node));
  return std::nullopt;
}

std::optional<std::string> ReadString(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (f.node.IsScalar()) return f.node.Scalar();
  diag.Error(f, "expected a string, got " + Describe(f.node));
  return std::nullopt;
}

std::optional<std::vector<Field>> ReadList(Diagnostics& diag, const Field& f) {
  if (!Present(f)) return std::nullopt;
  if (!f.node.IsSequence()) {
    diag.Error(f, "expected a list, got " + Describe(f.node));
    return std::nullopt;
  }
  std::vector<Field> items;
  for (size_t i = 0; i < f.node.size(); ++i) {
    YAML::Node item = f.node[i];
    items.push_back(Field{item, JoinPath(f.path, std::to_string(i)), MarkOf(item)});
  }
  return items;
}

std::optional<std::vector<std::string>> ReadStringList(Diagnostics& diag, const Field& f) {
  std::optional<std::vector<Field>> items = ReadList(diag, f);
  if (!items) return std::nullopt;
  std::vector<std::string> out;
  bool ok = true;
  for (const Field& item : *items) {
    std::optional<std::string> s = ReadString(diag, item);
    if (s)
      out.push_back(std::move(*s));
    else
      ok = false;
  }
  if (!ok) return std::nullopt;
  return out;
}

void ReportBadChoice(Diagnostics& diag, const Field& f, const std::string& got, const std::vector<std::string>& names) {
  std::string list;
  for (const std::string& n : names) list += (list.empty() ? "" : " | ") + n;
  std::string message = "must be one of " + list + " (got '" + got + "')";
  const std::string suggestion = Suggest(got, names);
  if (!suggestion.empty()) message += "; did you mean '" + suggestion + "'?";
  diag.Error(f, std::move(message));
}

}  // namespace spdl::config::internal
