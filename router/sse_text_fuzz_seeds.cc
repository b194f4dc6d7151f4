// Writes the seed corpus of sse_text_fuzz into the directory named by argv[1] (the input format
// is in sse_text_fuzz.cc): vocabularies with multi-byte characters split across tokens, control
// tokens, stop strings that span tokens, stop tokens and ids outside the vocabulary.
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Seed {
  std::vector<std::string> normal, control;  // raw bytes; text
  std::vector<std::string> stops;
  std::vector<int> stop_ids;
  std::vector<int> ids;  // -1 and the vocabulary's size are outside it
};

std::string Encode(const Seed& s) {
  std::string out;
  const int vocab = static_cast<int>(s.normal.size() + s.control.size());
  out.push_back(static_cast<char>(vocab - 1));
  for (const std::string& t : s.normal) {
    out.push_back(static_cast<char>(t.size() * 2));
    out += t;
  }
  for (const std::string& t : s.control) {
    out.push_back(static_cast<char>(t.size() * 2 + 1));
    out += t;
  }
  out.push_back(static_cast<char>(s.stops.size()));
  for (const std::string& t : s.stops) {
    out.push_back(static_cast<char>(t.size() - 1));
    out += t;
  }
  out.push_back(static_cast<char>(s.stop_ids.size()));
  for (int id : s.stop_ids) out.push_back(static_cast<char>(id + 1));
  for (int id : s.ids) out.push_back(static_cast<char>(id + 1));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR\n", argv[0]);
    return 2;
  }
  const std::vector<Seed> seeds = {
      // "Hello world" with a stop string across two tokens.
      {{"Hel", "lo", " wor", "ld", "\n"}, {"<|im_end|>"}, {"o w"}, {5}, {0, 1, 2, 3, 4, 5, 0}},
      // é and 😀 split over tokens; a stop string that starts like the text goes on.
      {{"\xC3", "\xA9", "\xF0\x9F", "\x98\x80", "a", "ab"},
       {},
       {"abc", "\xF0\x9F\x98\x81"},
       {},
       {0, 1, 2, 3, 4, 5, 4, 5, 2, 3}},
      // Cut-off characters, ids outside the vocabulary, and a stop on U+FFFD.
      {{"\xE2\x82", "x", "\xFF"}, {"</s>"}, {"\xEF\xBF\xBD", "x</"}, {}, {0, 1, -1, 2, 1, 3, 4, 0}},
      // A stop token before any text.
      {{"a", "b"}, {"<eos>"}, {}, {2}, {2, 0, 1}},
      // Stop strings prefixes of one another.
      {{"ab", "a", "b", " "}, {}, {"aba", "ab", "b a"}, {}, {1, 2, 3, 1, 0, 1, 2}},
  };
  for (size_t i = 0; i < seeds.size(); ++i) {
    std::ofstream(std::string(argv[1]) + "/seed" + std::to_string(i), std::ios::binary)
        << Encode(seeds[i]);
  }
  return 0;
}
