/// \file suite_manifest.hpp
/// \brief The golden suite a `orthros check --suite` reads: where its manifest is, and whether
/// the manifest's list of cases is complete, checked before any case is judged.
#pragma once

#include "orthros/tensor.hpp"

#include <nlohmann/json.hpp>

#include <cstddef>
#include <filesystem>
#include <map>
#include <string>
#include <utility>

namespace orthros::portkit {

namespace fs = std::filesystem;

/// The suite directory and its manifest from --suite: a directory holding manifest.json, or the
/// path of the manifest file itself. \throws orthros::Error naming what is there instead.
inline std::pair<fs::path, fs::path> suite_paths(const std::string& suite) {
  std::error_code ec;
  const fs::file_status s = fs::status(suite, ec);
  require(fs::exists(s), "--suite: ", suite,
          " does not exist (give a suite directory holding manifest.json; write one with `orthros golden --out DIR`)");
  if (fs::is_regular_file(s)) return {fs::path(suite).parent_path(), fs::path(suite)};  // .../manifest.json
  require(fs::is_directory(s), "--suite: ", suite, " is neither a suite directory nor its manifest.json");
  const fs::path root(suite);
  require(fs::exists(root / "manifest.json"), "--suite: cannot read ", (root / "manifest.json").string(),
          " (no such file; write a suite with `orthros golden --out DIR`)");
  return {root, root / "manifest.json"};
}

/// Checks the manifest's list of cases before anything is judged: every entry is an object with
/// a unique string "name" and string "file" and "expected", and every member of "groups" is a
/// case of the list. \throws orthros::Error naming the entry.
inline void require_complete_manifest(const nlohmann::ordered_json& m, const std::string& where) {
  require(!m["cases"].empty(), where, ": \"cases\" is empty");
  std::map<std::string, int> names;
  for (size_t i = 0; i < m["cases"].size(); ++i) {
    const nlohmann::ordered_json& jc = m["cases"][i];
    require(jc.is_object() && jc.contains("name") && jc["name"].is_string(), where, ": case entry ", i,
            " has no \"name\" string");
    const std::string name = jc["name"].get<std::string>();
    require(names.emplace(name, 0).second, where, ": case \"", name, "\" is listed twice");
    for (const char* key : {"file", "expected"})
      require(jc.contains(key) && jc[key].is_string(), where, ": case \"", name, "\" has no \"", key, "\" path");
  }
  if (!m.contains("groups")) return;
  require(m["groups"].is_object() || m["groups"].is_array() || m["groups"].is_null(), where,
          ": \"groups\" must be an object");
  std::map<std::string, std::size_t> group_size;  // group name -> members listed under "groups"
  for (const auto& [key, members] : m["groups"].items()) {
    const nlohmann::ordered_json& list = members.is_object() && members.contains("cases") ? members["cases"] : members;
    const std::string group = members.is_object() ? members.value("name", key) : key;
    if (!list.is_array()) continue;
    group_size[group] = list.size();
    for (const nlohmann::ordered_json& n : list)
      require(n.is_string() && names.count(n.get<std::string>()), where, ": group \"", group,
              "\" names case ", n.dump(), ", which \"cases\" does not list");
  }
  // A case that says it is one of `size` cases of a group: the group lists that many (a ragged
  // batch or a chunked prefill with a case left out of the manifest is incomplete).
  for (const nlohmann::ordered_json& jc : m["cases"]) {
    if (!jc.contains("group") || !jc["group"].is_object() || !jc["group"].contains("name")) continue;
    const std::string group = jc["group"]["name"].is_string() ? jc["group"]["name"].get<std::string>() : "";
    const auto it = group_size.find(group);
    require(it != group_size.end(), where, ": case \"", jc["name"].get<std::string>(), "\" is in group \"", group,
            "\", which \"groups\" does not list");
    require(!jc["group"].contains("size") || jc["group"]["size"] == it->second, where, ": case \"",
            jc["name"].get<std::string>(), "\" says group \"", group, "\" has ", jc["group"]["size"].dump(),
            " cases, but \"groups\" lists ", it->second);
  }
}

}  // namespace orthros::portkit
