// YamlReader: the schema-checking toolkit the config parsers are built from. It loads one YAML
// document, applies --set overrides to it, and reads typed values out of it, recording every
// problem as a ConfigError (with its line) instead of stopping at the first.
//
// Internal to spdl_config: the public headers (job_config.h, daemon_config.h) do not include
// yaml-cpp. Nothing here throws on bad input; yaml-cpp's exceptions are caught here or in the
// Parse* functions that use it. Not thread-safe: one Diagnostics (and its readers) per parse,
// used from one thread.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "config/config_error.h"
#include "config/override.h"

namespace spdl::config::internal {

// A value in the document, with its name and place.
struct Field {          // NOLINT(bugprone-exception-escape): yaml-cpp's Node assignment may throw (it allocates)
  YAML::Node node;      // the value; undefined (IsDefined() false) when its key is absent
  std::string path;     // dotted path, e.g. "batch.size" or "transforms.0"
  YAML::Mark key_mark;  // where its key is (for the root and sequence items: the value itself;
                        // for an absent key: the parent's key); null mark when made by an override
};

// Wraps a document root as a Field (path "", placed at the root, or at 1:1 when it has no place).
Field RootField(const YAML::Node& root);

// Gathers the errors of one parse. Knows which paths were set by --set, so that errors about
// them say "--set <path>" and no line (the YAML line of an override's value is meaningless).
class Diagnostics {
 public:
  explicit Diagnostics(std::vector<std::string> override_paths = {});

  // Records `message` about `field`, placed at its value (at its key when the value is absent
  // or null).
  void Error(const Field& field, std::string message);
  // Records `message` about `field`, placed at its key (unknown keys, whole-entry problems).
  void ErrorAtKey(const Field& field, std::string message);
  // Records an error with no line; `path` is used as given.
  void ErrorNoLine(std::string path, std::string message);
  // Records an error at `mark` (0-based, as yaml-cpp gives it) for the whole document.
  void ErrorAtMark(const YAML::Mark& mark, std::string message);

  // Number of errors recorded so far (lets a reader tell whether a part of the document was good).
  size_t count() const { return errors_.size(); }
  // Returns every error, sorted by line (errors without a line last, in the order recorded).
  std::vector<ConfigError> Take();

 private:
  // True when `path` is at or below a path set by an override.
  bool FromOverride(const std::string& path) const;
  void Record(const Field& field, const YAML::Mark& mark, std::string message);

  std::vector<std::string> override_paths_;
  std::vector<ConfigError> errors_;
};

// Parses `text` as one YAML document and applies `overrides` to it in order. Records syntax
// errors (at their line) and bad override paths or values (no line) in *diag. Returns the root
// (a Null node for an empty document), or nullopt when the text is not valid YAML.
std::optional<YAML::Node> LoadDocument(std::string_view text, const std::vector<Override>& overrides,
                                       Diagnostics* diag);

// Reads one map of the document: hands out its values by key and, at the end, reports the keys
// nobody asked for. A null or absent field reads as an empty map (all defaults); any other
// non-map records one error and reads as an empty map that reports nothing more.
// REQUIRES: *diag outlives the reader.
class MapReader {
 public:
  struct Entry {
    std::string key;    // the key's text
    Field field;        // its value
    bool used = false;  // asked for by Get/Require
  };

  MapReader(Diagnostics& diag, Field field);

  // Returns the value under `key` (an undefined node when absent); `key` becomes a known key.
  Field Get(std::string_view key);
  // As Get, and records "required key is missing" (at this map's key) when `key` is absent.
  Field Require(std::string_view key);
  // Records an error for each key never passed to Get/Require, with "did you mean" when one
  // known key is close. Call once, after all the reads.
  void ReportUnknownKeys();

  // False when the field was present but not a map (that error is already recorded).
  bool ok() const { return ok_; }
  const Field& field() const { return field_; }
  const std::vector<Entry>& entries() const { return entries_; }

 private:
  Diagnostics& diag_;
  Field field_;
  bool ok_ = true;
  std::vector<Entry> entries_;      // in document order
  std::vector<std::string> known_;  // keys asked for, for suggestions
};

// True when the key was written (even with a null value).
inline bool Present(const Field& f) { return f.node.IsDefined(); }

// Describes a value for a message: "a map", "a list", "nothing (null)" or "'text'" (shortened).
std::string Describe(const YAML::Node& node);
// Returns the candidate closest to `word` (case-insensitive; a unique best within 2 edits, else
// the one candidate that `word` is a prefix of, or that is a prefix of `word`), or "" if none.
std::string Suggest(std::string_view word, const std::vector<std::string>& candidates);

// Value readers. Each returns nullopt without a word when the field is absent, and nullopt after
// recording an error when the value is of the wrong type or out of range.
std::optional<int64_t> ReadInt(Diagnostics& diag, const Field& f, int64_t min, int64_t max);
std::optional<uint64_t> ReadUint64(Diagnostics& diag, const Field& f);
std::optional<bool> ReadBool(Diagnostics& diag, const Field& f);
std::optional<std::string> ReadString(Diagnostics& diag, const Field& f);
// A list of strings (one error per bad item).
std::optional<std::vector<std::string>> ReadStringList(Diagnostics& diag, const Field& f);
// A list's items as Fields named "path.0", "path.1", ...; records an error when not a list.
std::optional<std::vector<Field>> ReadList(Diagnostics& diag, const Field& f);

// Reads a string that must be one of `choices` (exact match); the value paired with it.
template <typename E>
std::optional<E> ReadChoice(Diagnostics& diag, const Field& f,
                            std::initializer_list<std::pair<std::string_view, E>> choices);

// Records "must be one of a | b | c (got 'x')". Used by ReadChoice.
void ReportBadChoice(Diagnostics& diag, const Field& f, const std::string& got, const std::vector<std::string>& names);

template <typename E>
std::optional<E> ReadChoice(Diagnostics& diag, const Field& f,
                            std::initializer_list<std::pair<std::string_view, E>> choices) {
  std::optional<std::string> s = ReadString(diag, f);
  if (!s) return std::nullopt;
  std::vector<std::string> names;
  for (const auto& [name, value] : choices) {
    if (*s == name) return value;
    names.emplace_back(name);
  }
  ReportBadChoice(diag, f, *s, names);
  return std::nullopt;
}

}  // namespace spdl::config::internal
