// The docs list the registry: README.md's device table, docs/collectives.md's ccl table and
// docs/kv.md's kv table are exactly params::markdown_table(), and every SOFTRDMA_* name used
// anywhere in the tree is either registered or one of the build-time names below.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/params.h"

namespace softrdma::params {
namespace {

namespace fs = std::filesystem;

std::string read_file(const fs::path& p) {
  std::ifstream in(p);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

/// The text between "<!-- params:GROUP -->\n" and "<!-- /params:GROUP -->" in `file`.
std::string generated_block(const fs::path& file, Group g) {
  const std::string text = read_file(file);
  const std::string begin = "<!-- params:" + std::string(group_name(g)) + " -->\n";
  const std::string end = "<!-- /params:" + std::string(group_name(g)) + " -->";
  const size_t b = text.find(begin);
  const size_t e = text.find(end);
  if (b == std::string::npos || e == std::string::npos || e < b) return "(no " + begin + ")";
  return text.substr(b + begin.size(), e - b - begin.size());
}

TEST(Docs, ReadmeListsTheDeviceParametersFromTheRegistry) {
  EXPECT_EQ(markdown_table(Group::kDevice),
            generated_block(fs::path(SOFTRDMA_SOURCE_DIR) / "README.md", Group::kDevice))
      << "README.md is out of date: paste `build/bin/softrdma params --markdown device` "
         "between its <!-- params:device --> markers";
}

TEST(Docs, CollectivesDocListsTheCclParametersFromTheRegistry) {
  EXPECT_EQ(markdown_table(Group::kCcl),
            generated_block(fs::path(SOFTRDMA_SOURCE_DIR) / "docs" / "collectives.md", Group::kCcl))
      << "docs/collectives.md is out of date: paste `build/bin/softrdma params --markdown ccl` "
         "between its <!-- params:ccl --> markers";
}

TEST(Docs, KvDocListsTheKvParametersFromTheRegistry) {
  EXPECT_EQ(markdown_table(Group::kKv),
            generated_block(fs::path(SOFTRDMA_SOURCE_DIR) / "docs" / "kv.md", Group::kKv))
      << "docs/kv.md is out of date: paste `build/bin/softrdma params --markdown kv` "
         "between its <!-- params:kv --> markers";
}

TEST(Docs, RdmaCmDocListsTheCmParametersFromTheRegistry) {
  EXPECT_EQ(markdown_table(Group::kCm),
            generated_block(fs::path(SOFTRDMA_SOURCE_DIR) / "docs" / "rdma-cm.md", Group::kCm))
      << "docs/rdma-cm.md is out of date: paste `build/bin/softrdma params --markdown cm` "
         "between its <!-- params:cm --> markers";
}

TEST(Docs, EverySoftrdmaVariableInTheTreeIsRegistered) {
  // Names that are not environment variables: CMake options and target properties, compile
  // definitions, macros, symbol version nodes (SOFTRDMA_PRIVATE_1.0 of verbs/libibverbs.map).
  const std::set<std::string> build_time = {"SOFTRDMA_TESTS",
                                            "SOFTRDMA_SANITIZE",
                                            "SOFTRDMA_FUZZ",
                                            "SOFTRDMA_FUZZ_FLAGS",
                                            "SOFTRDMA_VERSION",
                                            "SOFTRDMA_HAVE_ISAL",
                                            "SOFTRDMA_COUNTERS",
                                            "SOFTRDMA_COUNTER_FIELD",
                                            "SOFTRDMA_COUNTER_NAME",
                                            "SOFTRDMA_IVDEP",
                                            "SOFTRDMA_AVX2",
                                            "SOFTRDMA_CCL_X86_DISPATCH",
                                            "SOFTRDMA_SOURCE_DIR",
                                            "SOFTRDMA_TORCH",
                                            "SOFTRDMA_PYTHON",
                                            "SOFTRDMA_PYTHON_DIR",
                                            "SOFTRDMA_DROPIN_DIR",
                                            "SOFTRDMA_PRIVATE_1",
                                            "SOFTRDMA_CM_COUNTERS",
                                            "SOFTRDMA_CM_COUNTER_FIELD",
                                            "SOFTRDMA_SANITIZE_OPTIMIZED"};
  std::set<std::string> registered;
  for (const Param& p : all()) registered.emplace(p.name);

  // Every SOFTRDMA_[A-Z0-9_]* token; one ending in "_" or followed by "*" is a prefix
  // ("SOFTRDMA_CCL_*"), not a variable.
  auto tokens = [](const std::string& text) {
    std::vector<std::string> out;
    const std::string lead = "SOFTRDMA_";
    for (size_t at = text.find(lead); at != std::string::npos; at = text.find(lead, at)) {
      size_t end = at + lead.size();
      while (end < text.size() &&
             (std::isupper(static_cast<unsigned char>(text[end])) ||
              std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '_'))
        ++end;
      const bool prefix = text[end - 1] == '_' || (end < text.size() && text[end] == '*');
      if (!prefix) out.push_back(text.substr(at, end - at));
      at = end;
    }
    return out;
  };
  const std::set<std::string> exts = {".cpp", ".h", ".sh", ".md", ".txt", ".py", ".json", ".cmake"};
  const fs::path root = SOFTRDMA_SOURCE_DIR;
  size_t files = 0;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const std::string name = it->path().filename().string();
    if (it->is_directory() && (name.rfind("build", 0) == 0 || name.front() == '.')) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file() ||
        (!exts.count(it->path().extension().string()) && name != "CMakeLists.txt"))
      continue;
    ++files;
    const std::string text = read_file(it->path());
    for (const std::string& n : tokens(text)) {
      EXPECT_TRUE(registered.count(n) || build_time.count(n))
          << n << " (" << fs::relative(it->path(), root).string()
          << ") is not in the parameter registry (base/params.h)";
    }
  }
  EXPECT_GT(files, 50u) << "the source tree was not found at " << root;
}

}  // namespace
}  // namespace softrdma::params
