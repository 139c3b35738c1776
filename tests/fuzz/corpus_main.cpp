// Regression driver: runs the fuzz target over every file of the corpus
// directories given on the command line (and over the seed inputs it writes
// to a temporary directory), without libFuzzer.
#include <dirent.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
void write_seed_corpus(const char* dir);

static int run_dir(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (!d) {
    std::fprintf(stderr, "cannot open corpus directory %s\n", dir.c_str());
    return -1;
  }
  int count = 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string path = dir + "/" + e->d_name;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) continue;
    std::vector<uint8_t> bytes;
    int c;
    while ((c = std::fgetc(f)) != EOF) bytes.push_back(uint8_t(c));
    std::fclose(f);
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
    // Every prefix of a corpus file is also a (truncated) input.
    for (size_t n = 0; n < bytes.size(); n += 1 + bytes.size() / 64) LLVMFuzzerTestOneInput(bytes.data(), n);
    ++count;
  }
  closedir(d);
  return count;
}

int main(int argc, char** argv) {
  char tmp[] = "/tmp/lowbit_seed_XXXXXX";
  if (!mkdtemp(tmp)) return 1;
  write_seed_corpus(tmp);
  int total = run_dir(tmp);
  for (int i = 1; i < argc; ++i) {
    int n = run_dir(argv[i]);
    if (n < 0) return 1;
    total += n;
  }
  std::printf("ran %d corpus inputs (and their prefixes) without a crash or a partial load\n", total);
  return 0;
}
