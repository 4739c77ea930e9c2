// The config's keys as config.cpp lists them: a reference into RunConfig by type, with its name, help
// and bounds, and the choice fields (choice.h) whatever their enum. Internal to config.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "optim/method.h"
#include "quant/format.h"
#include "train/config.h"

namespace gossamer::train::key_specs {

struct IntKey {
  const char* name;
  const char* help;
  std::int64_t& (*ref)(RunConfig&);
  std::int64_t min, max;
};
struct FloatKey {
  const char* name;
  const char* help;
  double& (*ref)(RunConfig&);
  double min, max;
  bool min_exclusive;
};
struct StringKey {
  const char* name;
  const char* help;
  std::string& (*ref)(RunConfig&);
  std::vector<std::string> choices;  // empty: any string
};
struct BoolKey {
  const char* name;
  const char* help;
  bool& (*ref)(RunConfig&);
};
// A reference to one of RunConfig's choice fields (choice.h), whatever its enum.
struct ChoiceField {
  std::string (*get)(const void*);
  bool (*set)(void*, std::string_view);
  std::vector<std::string> (*names)();
  void* at;
  std::string name() const { return get(at); }
};
template <typename E>
ChoiceField choice_field(E& e) {
  return ChoiceField{[](const void* p) { return name_of(*static_cast<const E*>(p)); },
                     [](void* p, std::string_view text) {
                       const auto v = parse_choice<E>(text);
                       if (v) *static_cast<E*>(p) = *v;
                       return v.has_value();
                     },
                     &choice_names<E>, &e};
}
// pipeline.stage_sync: one of the methods whose row allows it (optim/method.h), by name.
inline ChoiceField stage_sync_field(optim::Method& m) {
  return ChoiceField{[](const void* p) { return name_of(*static_cast<const optim::Method*>(p)); },
                     [](void* p, std::string_view text) {
                       const auto v = parse_choice<optim::Method>(text);
                       if (!v || !optim::method_info(*v).stage_sync) return false;
                       *static_cast<optim::Method*>(p) = *v;
                       return true;
                     },
                     &optim::stage_sync_names, &m};
}
// sparseloco.flush_codec: "none" (no flush), or a codec by name.
inline std::vector<std::string> flush_codec_names() {
  std::vector<std::string> out = choice_names<quant::CodecId>();
  out.emplace_back("none");
  return out;
}
inline ChoiceField flush_codec_field(std::optional<quant::CodecId>& f) {
  return ChoiceField{[](const void* p) {
                       const auto& v = *static_cast<const std::optional<quant::CodecId>*>(p);
                       return v ? name_of(*v) : std::string("none");
                     },
                     [](void* p, std::string_view text) {
                       auto& v = *static_cast<std::optional<quant::CodecId>*>(p);
                       if (text == "none") {
                         v.reset();
                         return true;
                       }
                       const auto id = parse_choice<quant::CodecId>(text);
                       if (id) v = *id;
                       return id.has_value();
                     },
                     &flush_codec_names, &f};
}
}  // namespace gossamer::train::key_specs
