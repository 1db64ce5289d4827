// A standalone runner of one kernel family on the CPU emulator, for the sanitizers of
// `capsules verify --sanitize` (capsule_core/sanitize.py): a sanitizer runtime must be in the
// process from its start, so sanitized kernels run here, in a child process, never in Python's.
// Included after the family's dispatch table (capsule_emu_run).
//
// Usage: runner SCRIPT. The script, one command per line:
//   buffer ID BYTES FILE|-      an exact-size allocation (256-byte aligned) with FILE's bytes, or
//                               left as it is ("-": the NaN pattern, or undefined under valgrind)
//   launch SYMBOL GX GY GZ BX BY BZ SHARED N ARG...   ARG: bID+OFFSET (a device pointer) or a
//                               64-bit word in decimal (a scalar, as capsule_emu_run reads it)
//   memset bID+OFFSET WORD N    N 32-bit words at the address set to WORD (a plan's Memset step)
//   copy bID+OFFSET bID+OFFSET BYTES   BYTES from the second address to the first (a Copy step)
//   dump ID FILE|-              write the buffer's bytes to FILE ("-": nowhere; under valgrind
//                               the bytes are still checked to be defined)
//   free ID                     release the buffer (a batch of cases frees each case's buffers)
//   case TEXT                   "capsule-emu: case TEXT" on stderr: the case the lines after it run
// stderr gets "capsule-emu: buffer ID ADDRESS BYTES" per allocation (to name buffers in reports)
// and "capsule-emu: error: ..." when a launch fails; the exit code is then 3. A sanitizer's death
// callback adds "capsule-emu: in KERNEL block (..) thread (..)" before the process ends.
#pragma once

#include <fstream>
#include <map>
#include <sstream>

#if defined(CAPSULE_EMU_VALGRIND)
#include <valgrind/memcheck.h>
#endif

extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace capsule_emu_runner {

struct Buffer {
    unsigned char* data = nullptr;
    size_t bytes = 0;
};

inline void where_on_death() {
    if (capsule_emu::state.current)
        std::fprintf(stderr, "capsule-emu: in %s\n", capsule_emu::where().c_str());
    else if (capsule_emu::state.kernel[0])
        std::fprintf(stderr, "capsule-emu: in %s block %s\n", capsule_emu::state.kernel, capsule_emu::dims(capsule_emu::state.block_index).c_str());
}

inline int fail(const std::string& message) {
    std::fprintf(stderr, "capsule-emu: error: %s\n", message.c_str());
    return 3;
}

inline int run(const char* script_path) {
    std::ifstream script(script_path);
    if (!script) return fail(std::string("cannot read ") + script_path);
    std::map<long, Buffer> buffers;
    std::string line;
    while (std::getline(script, line)) {
        std::istringstream in(line);
        std::string command;
        in >> command;
        if (command == "buffer") {
            long id;
            size_t bytes;
            std::string file;
            in >> id >> bytes >> file;
            void* p = nullptr;
            if (posix_memalign(&p, 256, bytes ? bytes : 1) != 0) return fail("out of memory");
            Buffer& b = buffers[id];
            b.data = static_cast<unsigned char*>(p);
            b.bytes = bytes;
            if (file != "-") {
                std::ifstream data(file, std::ios::binary);
                data.read(reinterpret_cast<char*>(b.data), static_cast<std::streamsize>(bytes));
                if (static_cast<size_t>(data.gcount()) != bytes) return fail("short buffer file " + file);
            } else {
#if !defined(CAPSULE_EMU_VALGRIND)
                for (size_t i = 0; i + 4 <= bytes; i += 4) std::memcpy(b.data + i, &capsule_emu::kSharedFill, 4);
#endif
            }
            std::fprintf(stderr, "capsule-emu: buffer %ld 0x%lx %zu\n", id, reinterpret_cast<unsigned long>(b.data), bytes);
        } else if (command == "launch") {
            std::string symbol;
            unsigned d[7];
            size_t n;
            in >> symbol;
            for (unsigned& v : d) in >> v;
            in >> n;
            std::vector<uint64_t> words(n ? n : 1);
            for (size_t i = 0; i < n; ++i) {
                std::string arg;
                in >> arg;
                if (arg[0] == 'b') {
                    const size_t plus = arg.find('+');
                    const long id = std::stol(arg.substr(1, plus - 1));
                    words[i] = reinterpret_cast<uint64_t>(buffers.at(id).data) + std::stoull(arg.substr(plus + 1));
                } else {
                    words[i] = std::stoull(arg);
                }
            }
            const int status = capsule_emu_run(symbol.c_str(), d, words.data());
            if (status == -1) return fail(symbol + " is not in this build");
            if (status != 1) return fail(capsule_emu::state.error);
        } else if (command == "memset" || command == "copy") {
            auto address = [&](const std::string& arg) -> unsigned char* {
                const size_t plus = arg.find('+');
                return buffers.at(std::stol(arg.substr(1, plus - 1))).data + std::stoull(arg.substr(plus + 1));
            };
            std::string first, second;
            size_t count;
            in >> first >> second >> count;
            if (command == "memset") {
                const uint32_t word = static_cast<uint32_t>(std::stoull(second));
                for (size_t i = 0; i < count; ++i) std::memcpy(address(first) + 4 * i, &word, 4);
            } else {
                std::memmove(address(first), address(second), count);
            }
        } else if (command == "dump") {
            long id;
            std::string file;
            in >> id >> file;
            const Buffer& b = buffers.at(id);
#if defined(CAPSULE_EMU_VALGRIND)
            // Names the first byte no kernel wrote (valgrind reports the block and offset).
            if (VALGRIND_CHECK_MEM_IS_DEFINED(b.data, b.bytes) != 0) return fail("buffer " + std::to_string(id) + " holds bytes no one wrote");
#endif
            if (file == "-") continue;
            std::FILE* out = std::fopen(file.c_str(), "wb");
            if (!out || std::fwrite(b.data, 1, b.bytes, out) != b.bytes || std::fclose(out) != 0)
                return fail("cannot write " + file);
        } else if (command == "free") {
            long id;
            in >> id;
            auto found = buffers.find(id);
            if (found == buffers.end()) return fail("free of unknown buffer " + std::to_string(id));
            std::free(found->second.data);
            buffers.erase(found);
        } else if (command == "case") {
            std::string text;
            std::getline(in >> std::ws, text);
            std::fprintf(stderr, "capsule-emu: case %s\n", text.c_str());
        } else if (!command.empty()) {
            return fail("unknown command " + command);
        }
    }
    for (auto& [id, b] : buffers) std::free(b.data);
    return 0;
}

}  // namespace capsule_emu_runner

int main(int argc, char** argv) {
    if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(&capsule_emu_runner::where_on_death);
    if (argc != 2) return capsule_emu_runner::fail("usage: runner SCRIPT");
    return capsule_emu_runner::run(argv[1]);
}
