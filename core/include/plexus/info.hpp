// The report `plexus info` prints: plugins found and skipped, devices, and per backend the ops
// and dtypes it implements.
#pragma once

#include <string>

namespace plexus {

class Runtime;

std::string info_text(const Runtime& runtime);
// The same as a JSON document.
std::string info_json(const Runtime& runtime);

}  // namespace plexus
