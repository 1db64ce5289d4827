// The CUDA device, emulated on the CPU: a kernel family's .cu file compiles unchanged with the host
// C++ compiler when this header is forced in first (g++ -std=c++20 -include capsule_emu.h), and runs
// through capsule_emu_run(symbol, dims, args) (capsule_core/backends/emu.py builds the table).
//
// The device code path runs: __CUDA_ARCH__ is 900, and the intrinsics get their IEEE meaning (the
// _rn roundings are single correctly rounded operations, the compiler contracts nothing:
// -ffp-contract=off). Host libm stands in for CUDA's.
//
// Every CUDA thread of a block is a fiber on one OS thread, run round-robin. The blocks of a launch
// run on a pool of OS threads (capsule_emu_set_threads; 1: one after another on the launching
// thread): each OS thread takes the next block of the launch's schedule, runs it to completion on
// its own fibers, with its own copy of the block's shared memory, static and dynamic, then takes
// the next, so blocks run concurrently and in no promised order, as on a GPU. Global memory is the
// one address space of the process, and atomics are the host's atomic operations. What the
// emulator promises about scheduling: the threads of a block run in the schedule's order
// (capsule_emu_set_order) and switch only at barriers and shuffles; blocks are claimed in the
// schedule's order but run at once; a kernel whose blocks write disjoint memory gives the same bits
// with any number of OS threads; the error of a failed launch is that of the first failing block
// in the schedule, whatever ran beside it. Sanitizer builds run a launch on one OS thread (the
// runtimes follow the fibers of one thread); racecheck orders no block after another, so a race
// between blocks is a finding there too. __syncthreads is a barrier of the block and a warp
// shuffle a barrier of the warp (32 consecutive linear thread indices); arrivals at one barrier
// must come from one source line. Strict where a GPU is:
// - a barrier or shuffle reached by part of a block or warp (or from different lines) is reported
//   with the kernel, block and which threads arrived, never hung;
// - __trap() ends the launch with an error naming the kernel, block and thread;
// - a misaligned access (a float4 at an address not a multiple of 16) ends the launch with an error
//   (the build instruments every typed access with -fsanitize=alignment; the handler is here);
// - shared memory, static and dynamic, holds a NaN pattern at the start of every block, as a GPU
//   holds stale bits, so a read before a write cannot pass for zeros;
// - a hardware fault in a kernel thread (a wild address, an integer division by zero) ends the
//   launch with an error naming the kernel, block, thread and signal, not the host process;
// - so does a thread that outgrows its kStackBytes of stack (each fiber's stack has an inaccessible
//   guard page below it, the build probes large frames page by page: -fstack-clash-protection).
// Sanitizer builds (capsule_core/sanitize/engine.py) define CAPSULE_EMU_SANITIZE (fibers switch as in
// every build, without a system call; AddressSanitizer is told of each switch, valgrind knows the
// stacks: swapcontext cost a signal-mask system call per switch, and under ASan the clearing of
// the whole new stack's shadow) and, for racecheck, CAPSULE_EMU_TSAN (every
// thread a TSan fiber, barriers and shuffles release/acquire among their participants, a launch
// boundary orders everything), or, for initcheck, CAPSULE_EMU_VALGRIND (shared memory undefined at
// the start of every block).
#pragma once

// The kernels' assert() calls __assert_fail; declared hidden here (before any kernel includes
// <cassert>), the emulator's definition below is the one the family library binds to.
#pragma GCC visibility push(hidden)
#include <assert.h>
#pragma GCC visibility pop
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <cerrno>
#include <exception>
#include <source_location>
#include <string>
#include <type_traits>
#include <vector>
#include <atomic>
#include <mutex>
#if !defined(CAPSULE_EMU_SANITIZE)
#include <condition_variable>
#include <pthread.h>
#include <thread>
#endif

#if !defined(__x86_64__)
#define CAPSULE_EMU_UCONTEXT 1
#include <ucontext.h>
#endif
#if !defined(CAPSULE_EMU_SANITIZE)
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#endif
#if defined(CAPSULE_EMU_VALGRIND)
#include <valgrind/memcheck.h>
#include <valgrind/valgrind.h>
#endif

#define __CUDA_ARCH__ 900
#define CAPSULE_EMU 1
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))
// Static shared variables: function-scope statics, gathered by capsule_emu.ld into one section so
// that each block starts with all of them filled. Thread-local, so that every OS thread running
// blocks has a copy of its own (a GPU block has its own shared memory); sanitizer builds, whose
// launches run on one OS thread, keep them plain statics (racecheck maps fresh pages for each
// block).
#if defined(CAPSULE_EMU_SANITIZE)
#define __shared__ static __attribute__((aligned(16)))
#else
#define __shared__ static thread_local __attribute__((aligned(16)))
#endif

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

struct alignas(8) float2 {
    float x, y;
};

struct alignas(16) float4 {
    float x, y, z, w;
};

struct alignas(8) int2 {
    int x, y;
};

struct alignas(16) int4 {
    int x, y, z, w;
};

struct alignas(8) uint2 {
    unsigned x, y;
};

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};

inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{x, y}; }
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return uint4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int2 make_int2(int x, int y) { return int2{x, y}; }
inline int4 make_int4(int x, int y, int z, int w) { return int4{x, y, z, w}; }

// -- arithmetic intrinsics: one IEEE operation each ---------------------------------------------

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
inline float rsqrtf(float a) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(a))); }
inline double rsqrt(double a) { return 1.0 / std::sqrt(a); }
inline float __saturatef(float a) { return a != a ? 0.0f : (a < 0.0f ? 0.0f : (a > 1.0f ? 1.0f : a)); }

template <class To, class From>
inline To capsule_emu_bits(From v) {
    static_assert(sizeof(To) == sizeof(From));
    To r;
    std::memcpy(&r, &v, sizeof r);
    return r;
}
inline int __float_as_int(float v) { return capsule_emu_bits<int>(v); }
inline unsigned __float_as_uint(float v) { return capsule_emu_bits<unsigned>(v); }
inline float __int_as_float(int v) { return capsule_emu_bits<float>(v); }
inline float __uint_as_float(unsigned v) { return capsule_emu_bits<float>(v); }
inline long long __double_as_longlong(double v) { return capsule_emu_bits<long long>(v); }
inline double __longlong_as_double(long long v) { return capsule_emu_bits<double>(v); }

inline void sincospi(double a, double* s, double* c) {
    *s = std::sin(M_PI * a);
    *c = std::cos(M_PI * a);
}

inline void sincospif(float a, float* s, float* c) {
    *s = static_cast<float>(std::sin(M_PI * static_cast<double>(a)));
    *c = static_cast<float>(std::cos(M_PI * static_cast<double>(a)));
}

inline float sinpif(float a) { return static_cast<float>(std::sin(M_PI * static_cast<double>(a))); }
inline float cospif(float a) { return static_cast<float>(std::cos(M_PI * static_cast<double>(a))); }

// -- memory intrinsics: typed accesses, so that the alignment instrumentation sees them ------------

template <class T>
inline T __ldg(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
template <class T>
inline void __stwt(T* p, T v) { *p = v; }

// -- the scheduler ------------------------------------------------------------------------------

#if defined(CAPSULE_EMU_TSAN)
#include <sys/mman.h>
extern "C" {
void* __tsan_get_current_fiber(void);
void* __tsan_create_fiber(unsigned flags);
void __tsan_destroy_fiber(void* fiber);
void __tsan_switch_to_fiber(void* fiber, unsigned flags);
void __tsan_set_fiber_name(void* fiber, const char* name);
void __tsan_acquire(void* addr);
void __tsan_release(void* addr);
void AnnotateIgnoreReadsBegin(const char* file, int line);
void AnnotateIgnoreReadsEnd(const char* file, int line);
void AnnotateIgnoreWritesBegin(const char* file, int line);
void AnnotateIgnoreWritesEnd(const char* file, int line);
}
#define CAPSULE_EMU_INTERNAL __attribute__((no_sanitize("thread"), noinline))
#else
#define CAPSULE_EMU_INTERNAL
#endif

#if defined(__SANITIZE_ADDRESS__)
#define CAPSULE_EMU_ASAN 1
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
extern "C" void __asan_unpoison_memory_region(const volatile void* addr, size_t size);
#endif

namespace capsule_emu {
// The emulator's own memory traffic, unseen by racecheck (callees included): only the kernels'
// accesses are the subject; the scheduler writes state between fibers that TSan cannot order.
struct Unobserved {
#if defined(CAPSULE_EMU_TSAN)
    Unobserved() {
        AnnotateIgnoreReadsBegin(__FILE__, __LINE__);
        AnnotateIgnoreWritesBegin(__FILE__, __LINE__);
    }
    ~Unobserved() {
        AnnotateIgnoreWritesEnd(__FILE__, __LINE__);
        AnnotateIgnoreReadsEnd(__FILE__, __LINE__);
    }
#endif
};
}  // namespace capsule_emu

#if !defined(CAPSULE_EMU_UCONTEXT)
// capsule_emu_switch(&save, to): saves the callee-saved registers and the stack pointer into
// *save, and resumes the context whose stack pointer is `to` (System V x86-64). No system call,
// unlike swapcontext, which saves the signal mask on every switch; no floating-point control
// words, which kernel code cannot change (KernelFloatingPoint sets them for a whole launch):
// stmxcsr, ldmxcsr and fldcw were four fifths of a switch.
extern "C" void capsule_emu_switch(void** save, void* to);
asm(R"(
    .text
    .p2align 4
    .globl capsule_emu_switch
    .hidden capsule_emu_switch
    .type capsule_emu_switch, @function
capsule_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size capsule_emu_switch, .-capsule_emu_switch
)");
#endif

extern "C" char __start_capsule_emu_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_capsule_emu_shared[] __attribute__((weak, visibility("hidden")));
#if !defined(CAPSULE_EMU_SANITIZE)
// The bounds of this OS thread's copy of the thread-local shared variables: capsule_emu.ld puts
// these two around them (each translation unit, so each family library, has its own pair).
// Initialised, so that the section they bound holds data (zeros) in the TLS image: a section of
// zero-fill alone would be laid over the emulator's own thread-locals by the linker.
static thread_local char capsule_emu_shared_begin __attribute__((section(".tdata.capsule_emu_shared_0"), aligned(16))) = 1;
static thread_local char capsule_emu_shared_end __attribute__((section(".tdata.capsule_emu_shared_2"), aligned(16))) = 1;
#endif

namespace capsule_emu {

using Site = std::source_location;

constexpr uint32_t kSharedFill = 0x7FE5E5E5u;  // a NaN: what shared memory holds when a block starts

#if defined(CAPSULE_EMU_SANITIZE)
constexpr size_t kStackBytes = 512 * 1024;
#else
constexpr size_t kStackBytes = 128 * 1024;
#endif

struct Barrier {
    const char* kind = "__syncthreads";
    unsigned size = 0;
    unsigned arrived = 0;
    unsigned long generation = 0;
    Site site;
    char sync[2];  // release/acquire objects of alternate generations (racecheck)
};

struct Fiber {
#if defined(CAPSULE_EMU_UCONTEXT)
    ucontext_t context;
#else
    void* sp = nullptr;
#endif
#if defined(CAPSULE_EMU_TSAN)
    void* tsan = nullptr;
#endif
#if defined(CAPSULE_EMU_ASAN)
    const char* stack_bottom = nullptr;
    void* fake_stack = nullptr;
#endif
    dim3 thread;
    unsigned linear = 0;
    bool done = false;
    Barrier* waiting = nullptr;
};

struct Warp {
    Barrier barrier;
    uint64_t exchange[2][32];  // by the parity of the barrier's generation (exchange())
};

// What every block of one launch shares: the kernel and its configuration, the schedule, the
// claim counter, and the first failure in the schedule's order (copied from the state of the OS
// thread that ran the failing block).
struct Launch {
    const char* kernel = "";
    dim3 grid_dim, block_dim;
    unsigned dynamic_bytes = 0;
    void (*body)(const void*) = nullptr;
    const void* body_data = nullptr;
    int order = 0;
    uint64_t order_seed = 0;
    double timeout_seconds = 0;
    uint64_t total = 0;
    std::vector<unsigned> blocks;  // the schedule's order of linear block indices (empty: index order)
    std::atomic<uint64_t> next{0}, done{0};
    std::atomic<bool> stop{false};
    std::mutex failure_lock;
    uint64_t failed_at = UINT64_MAX;  // the failing block's place in the schedule
    std::string error;
    int fault_signal = 0, fault_code = 0, fault_access = 0, timed_out = 0;
    const void* fault_address = nullptr;
    const void* fault_pc = nullptr;
    // The launching family library's run_blocks: the pool's threads serve every library loaded, and
    // each library's blocks must run its own code (its shared variables, its fault handling).
    void (*run)(Launch&) = nullptr;

    dim3 block_at(uint64_t i) const {
        const uint64_t b = blocks.empty() ? i : blocks[i];
        return dim3{unsigned(b % grid_dim.x), unsigned((b / grid_dim.x) % grid_dim.y), unsigned(b / (uint64_t(grid_dim.x) * grid_dim.y))};
    }
};

// The emulator's state on one OS thread: the block it runs, its fibers, and what a launch asked
// for (the settings are read from the launching thread's state).
struct State {
#if defined(CAPSULE_EMU_UCONTEXT)
    ucontext_t scheduler;
#else
    void* scheduler = nullptr;
#endif
#if defined(CAPSULE_EMU_TSAN)
    void* host_fiber = nullptr;
    char launch_begin = 0, launch_end = 0;
#endif
#if defined(CAPSULE_EMU_ASAN)
    const void* scheduler_bottom = nullptr;  // the scheduler's stack, as ASan told the first fiber
    size_t scheduler_size = 0;
    void* scheduler_fake_stack = nullptr;
    bool stacks_dirty = false;  // a block ended in an error: its fibers' frames are left poisoned
#endif
#if defined(CAPSULE_EMU_SANITIZE)
    std::vector<std::vector<char>> stacks;
#endif
    std::vector<Fiber> fibers;
    Barrier* block_barrier = nullptr;
    std::vector<Warp>* warps = nullptr;
    Fiber* current = nullptr;
    bool progress = false;
    bool aborted = false;
    const char* kernel = "";
    dim3 block_index, block_dim, grid_dim;
    std::vector<unsigned char> dynamic_shared;
    unsigned dynamic_bytes = 0;
    void (*body)(const void*) = nullptr;
    const void* body_data = nullptr;
    std::string error;
    int fault_signal = 0, fault_code = 0;  // a kernel thread's hardware fault (signal number, si_code)
    const void* fault_address = nullptr;
    int fault_access = 0;  // what the faulting instruction did: 0 unknown, 1 read, 2 write, 3 instruction fetch
    const void* fault_pc = nullptr;
    double timeout_seconds = 0;  // the watchdog of a launch (0: none), capsule_emu_set_launch_timeout
    volatile int timed_out = 0;
    Launch* launch = nullptr;  // the launch whose blocks this thread runs
    // The schedule of the next launch (capsule_emu_set_order; back to 0 after it): 0 blocks and
    // threads in index order, 1 reversed, 2 shuffled by `order_seed`. A GPU promises no order; a
    // result that depends on it (a float atomicAdd sum) changes bits between two schedules.
    int order = 0;
    uint64_t order_seed = 0;
};

inline thread_local State state;

inline std::string dims(dim3 d) {
    return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

CAPSULE_EMU_INTERNAL inline std::string where() {
    std::string s = std::string(state.kernel) + " block " + dims(state.block_index);
    if (state.current) s += " thread " + dims(state.current->thread);
    return s;
}

inline std::string site_text(const Site& site) {
    const char* file = site.file_name();
    const char* slash = std::strrchr(file, '/');
    return std::string(slash ? slash + 1 : file) + ":" + std::to_string(site.line());
}

// "0-4,7,9-31" for the sorted indices.
inline std::string ranges(const std::vector<unsigned>& v) {
    std::string s;
    for (size_t i = 0; i < v.size();) {
        size_t j = i;
        while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
        if (!s.empty()) s += ",";
        s += std::to_string(v[i]);
        if (j > i) s += "-" + std::to_string(v[j]);
        i = j + 1;
    }
    return s.empty() ? "none" : s;
}

// Scratch of each kernel thread for the emulation of device state a thread keeps between its
// instructions (linalg.cuh's cp.async queue): fiber_local(), as many bytes as this. It holds what
// the thread's last block left; the emulation resets it when a block starts.
constexpr size_t kFiberLocalBytes = 4096;

#if !defined(CAPSULE_EMU_SANITIZE)
// The fibers' stacks, in one mapping per OS thread kept across launches. Stack t lies at the top of
// slot t, kSlotBytes aligned to kSlotBytes, under the slot's header (its fiber_local bytes, its
// fiber and the state of the OS thread that runs it), above a guard page that is never
// accessible, so a thread that outgrows its stack faults there instead of writing over its
// neighbour's. Kernel code finds its fiber from its stack pointer (here()), without a thread-local
// lookup on every threadIdx. Pages are touched only as threads use them.
constexpr size_t kSlotBytes = 256 * 1024;

struct SlotHeader {
    alignas(64) unsigned char local[kFiberLocalBytes];  // fiber_local()
    Fiber* fiber;
    State* state;
    char pad[48];
};

// Slot s's header, and the stack under it, lie s mod kColours cache lines below the top of the
// slot: slots are a power of two apart, so otherwise every fiber's header and stack top would
// share the same few cache sets, and resuming a fiber would miss the caches (most of the time of
// a switch, before).
constexpr size_t kColours = 256;
constexpr size_t kPageBytes = 4096;  // x86-64's (capsule_emu_switch is x86-64 code)
static_assert((kSlotBytes & (kSlotBytes - 1)) == 0 &&
              kSlotBytes >= kStackBytes + sizeof(SlotHeader) + kColours * 64 + 2 * kPageBytes);

inline uintptr_t header_address(uintptr_t slot) {
    return slot + kSlotBytes - sizeof(SlotHeader) - slot / kSlotBytes % kColours * 64;
}

struct GuardedStacks {
    char* mapping = nullptr;
    size_t mapped = 0;
    char* base = nullptr;  // the first slot
    size_t count = 0;
    size_t guard = 0;

    size_t stride() const { return kSlotBytes; }
    char* stack(unsigned t) const { return reinterpret_cast<char*>(&header(t)) - kStackBytes; }
    SlotHeader& header(unsigned t) const {
        return *reinterpret_cast<SlotHeader*>(header_address(reinterpret_cast<uintptr_t>(base) + t * kSlotBytes));
    }
    // The guard page of stack t: the page below the one its bottom lies in.
    char* guard_page(unsigned t) const {
        return reinterpret_cast<char*>(reinterpret_cast<uintptr_t>(stack(t)) & ~uintptr_t(guard - 1)) - guard;
    }

    // Room for n stacks (the mapping only grows); false, with no stacks left, when the system
    // refuses the mapping or its guard pages (each guard splits off a mapping of its own, and
    // vm.max_map_count bounds those).
    bool reserve(size_t n) {
        if (n <= count) return true;
        release();
        guard = static_cast<size_t>(sysconf(_SC_PAGESIZE));
        if (guard > kPageBytes) return false;
        const size_t bytes = (n + 1) * kSlotBytes;
        void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) return false;
        mapping = static_cast<char*>(p);
        mapped = bytes;
        base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(mapping) + kSlotBytes - 1) & ~uintptr_t(kSlotBytes - 1));
        count = n;
        for (size_t t = 0; t < n; ++t)
            if (mprotect(guard_page(unsigned(t)), guard, PROT_NONE) != 0) {
                release();
                return false;
            }
        return true;
    }

    void release() {
        if (mapping) munmap(mapping, mapped);
        mapping = base = nullptr;
        mapped = count = 0;
    }

    // Whether address lies in a guard page.
    bool guards(const void* address) const {
        const char* a = static_cast<const char*>(address);
        if (!base || a < base || a >= base + count * kSlotBytes) return false;
        const char* page = guard_page(unsigned(size_t(a - base) / kSlotBytes));
        return a >= page && a < page + guard;
    }
};
inline thread_local GuardedStacks guarded_stacks;

// The fiber running this code, and its OS thread's state: from the header of the stack slot (kernel
// code only: it runs on a fiber's stack).
CAPSULE_EMU_INTERNAL inline SlotHeader& slot() {
    const uintptr_t sp = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
    return *reinterpret_cast<SlotHeader*>(header_address(sp & ~uintptr_t(kSlotBytes - 1)));
}
CAPSULE_EMU_INTERNAL inline State& here() { return *slot().state; }
CAPSULE_EMU_INTERNAL inline Fiber& me() { return *slot().fiber; }
// In the slot header, found from the stack pointer: a thread-local array would cost a
// __tls_get_addr call on every access from a family library (dynamic TLS).
CAPSULE_EMU_INTERNAL inline void* fiber_local() { return slot().local; }
#else
CAPSULE_EMU_INTERNAL inline State& here() { return state; }
CAPSULE_EMU_INTERNAL inline Fiber& me() { return *state.current; }
struct FiberLocal {
    alignas(64) unsigned char bytes[kFiberLocalBytes];
};
inline thread_local std::vector<FiberLocal> fiber_locals;  // one per thread of the block, grown by run_block
CAPSULE_EMU_INTERNAL inline void* fiber_local() { return fiber_locals[me().linear].bytes; }
#endif

// Back to the scheduler of `state`'s OS thread (from a fiber: here(); from a signal handler, which
// runs on its own stack: the thread-local state).
CAPSULE_EMU_INTERNAL inline void to_scheduler(State& state = here()) {
    Fiber* f = state.current;
#if defined(CAPSULE_EMU_TSAN)
    __tsan_switch_to_fiber(state.host_fiber, 1);
#endif
#if defined(CAPSULE_EMU_ASAN)
    __sanitizer_start_switch_fiber(&f->fake_stack, state.scheduler_bottom, state.scheduler_size);
#endif
#if defined(CAPSULE_EMU_UCONTEXT)
    swapcontext(&f->context, &state.scheduler);
#else
    capsule_emu_switch(&f->sp, state.scheduler);
#endif
#if defined(CAPSULE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(f->fake_stack, nullptr, nullptr);
#endif
}

CAPSULE_EMU_INTERNAL inline void to_fiber(State& state, Fiber& f) {
    state.current = &f;
#if defined(CAPSULE_EMU_TSAN)
    __tsan_switch_to_fiber(f.tsan, 1);
#endif
#if defined(CAPSULE_EMU_ASAN)
    __sanitizer_start_switch_fiber(&state.scheduler_fake_stack, f.stack_bottom, kStackBytes);
#endif
#if defined(CAPSULE_EMU_UCONTEXT)
    swapcontext(&state.scheduler, &f.context);
#else
    capsule_emu_switch(&state.scheduler, f.sp);
#endif
#if defined(CAPSULE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(state.scheduler_fake_stack, nullptr, nullptr);
#endif
}

// Ends the launch with `message` (the first error of a launch is kept); never returns.
[[noreturn]] CAPSULE_EMU_INTERNAL inline void abort_launch(const std::string& message) {
    Unobserved quiet;
    State& state = here();
    if (state.error.empty()) state.error = message;
    state.aborted = true;
    for (;;) to_scheduler();
}

#if !defined(CAPSULE_EMU_SANITIZE)

// A hardware fault in kernel code ends the launch as __trap does: the handler runs on a signal
// stack of its own (the faulting fiber's may be the cause) and leaves it for the scheduler, never
// returning to the faulting instruction (SA_NODEFER: the signal is not left blocked; once off the
// signal stack, the next fault may use it again). It only notes the fault; run_block words the
// error once back on the scheduler's stack. A fault outside a kernel thread (the emulator's own,
// or another OS thread's) goes to the handler that was there before the launch. Sanitizer builds
// leave faults to their runtimes.
constexpr int kFaultSignals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
constexpr int kFaultSignalCount = 5;
inline struct sigaction saved_actions[kFaultSignalCount];
inline thread_local bool launching = false;

inline void restore_fault_handlers() {
    for (int i = 0; i < kFaultSignalCount; ++i) sigaction(kFaultSignals[i], &saved_actions[i], nullptr);
}

// Whether the signal interrupted a kernel thread (a fiber), not the scheduler: by the interrupted
// stack pointer where the platform says it, else by whether a fiber is current.
inline bool on_fiber(void* context) {
#if defined(__x86_64__)
    const auto* sp = reinterpret_cast<const char*>(static_cast<ucontext_t*>(context)->uc_mcontext.gregs[REG_RSP]);
    return guarded_stacks.base && sp >= guarded_stacks.base && sp < guarded_stacks.base + guarded_stacks.count * guarded_stacks.stride();
#else
    (void)context;
    return state.current != nullptr;
#endif
}

inline void on_fault(int signo, siginfo_t* info, void* context) {
    if (!launching || !state.current || state.aborted || !on_fiber(context)) {
        restore_fault_handlers();  // the faulting instruction runs again, under the previous handler
        return;
    }
    state.fault_signal = signo;
    state.fault_code = info->si_code;
    state.fault_address = info->si_addr;
#if defined(__x86_64__)
    const auto& registers = static_cast<ucontext_t*>(context)->uc_mcontext.gregs;
    state.fault_pc = reinterpret_cast<const void*>(registers[REG_RIP]);
    // The page-fault error code: bit 1 a write, bit 4 an instruction fetch (no page fault: 0).
    const greg_t error = registers[REG_ERR];
    if (signo == SIGSEGV && info->si_code != SI_KERNEL) state.fault_access = (error & 0x10) ? 3 : (error & 2) ? 2 : 1;
#endif
    state.aborted = true;
    for (;;) to_scheduler(state);
}

// The launch watchdog (SIGVTALRM from a per-launch POSIX timer aimed at the launching thread): a
// kernel thread that runs past the deadline is left for the scheduler, which reports the launch as
// hung; when the scheduler itself is interrupted it sees the flag at its next step.
inline void on_timeout(int, siginfo_t*, void* context) {
    if (!launching) return;
    state.timed_out = 1;
    if (state.current && !state.aborted && on_fiber(context)) {
        state.aborted = true;
        for (;;) to_scheduler(state);
    }
}

struct Watchdog {
    timer_t timer{};
    bool armed = false;
    explicit Watchdog(double seconds) {
        state.timed_out = 0;
        if (!(seconds > 0)) return;
        static const bool installed = [] {
            struct sigaction action {};
            action.sa_sigaction = &on_timeout;
            action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
            sigemptyset(&action.sa_mask);
            return sigaction(SIGVTALRM, &action, nullptr) == 0;  // kept: a late signal finds it
        }();
        struct sigevent event {};
        event.sigev_notify = SIGEV_THREAD_ID;
        event.sigev_signo = SIGVTALRM;
        event._sigev_un._tid = static_cast<pid_t>(syscall(SYS_gettid));
        if (!installed || timer_create(CLOCK_MONOTONIC, &event, &timer) != 0) return;
        struct itimerspec when {};
        when.it_value.tv_sec = static_cast<time_t>(seconds);
        when.it_value.tv_nsec = static_cast<long>((seconds - static_cast<double>(when.it_value.tv_sec)) * 1e9);
        if (when.it_value.tv_sec == 0 && when.it_value.tv_nsec == 0) when.it_value.tv_nsec = 1;
        armed = timer_settime(timer, 0, &when, nullptr) == 0;
        if (!armed) timer_delete(timer);
    }
    ~Watchdog() {
        if (armed) timer_delete(timer);
    }
};

constexpr size_t kSignalStackBytes = 64 * 1024;

// Installs on_fault, and its signal stack, for the life of a launch; the host's (Python's
// faulthandler has one) come back after.
inline thread_local std::vector<char> signal_stack;

struct FaultHandlers {
    stack_t saved_stack{};
    FaultHandlers() {
        signal_stack.resize(kSignalStackBytes);
        stack_t own{};
        own.ss_sp = signal_stack.data();
        own.ss_size = signal_stack.size();
        sigaltstack(&own, &saved_stack);
        struct sigaction action {};
        action.sa_sigaction = &on_fault;
        action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
        sigemptyset(&action.sa_mask);
        for (int i = 0; i < kFaultSignalCount; ++i) sigaction(kFaultSignals[i], &action, &saved_actions[i]);
        launching = true;
    }
    ~FaultHandlers() {
        launching = false;
        restore_fault_handlers();
        sigaltstack(&saved_stack, nullptr);
    }
};

inline std::string fault_report() {
    const int sig = state.fault_signal, code = state.fault_code;
    std::string what = sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE" : sig == SIGABRT ? "SIGABRT" : "SIGILL";
    const char* access = state.fault_access == 1 ? " read" : state.fault_access == 2 ? " write" : state.fault_access == 3 ? " instruction fetch" : "";
    if (sig == SIGABRT) {
        what = "abort() called (SIGABRT)";
    } else if (sig == SIGSEGV && code == SI_KERNEL) {
        what += ": general protection fault (an address outside the canonical range: an index far out of bounds)";
    } else if (sig == SIGFPE) {
        what += code == FPE_INTDIV ? ", integer divide by zero" : code == FPE_INTOVF ? ", integer overflow" : ", arithmetic fault";
    } else if (sig == SIGSEGV && guarded_stacks.guards(state.fault_address)) {
        what = "stack overflow: the thread needed more than its " + std::to_string(kStackBytes / 1024) +
               " KiB of stack on the emulator (a large local array, or deep recursion)";
    } else if (sig == SIGSEGV || sig == SIGBUS) {
        char address[32];
        std::snprintf(address, sizeof address, "%p", state.fault_address);
        what += std::string(":") + access + " at address " + address +
                (sig == SIGSEGV ? (code == SEGV_MAPERR ? " (not mapped)" : " (access not permitted)") : " (bus error)");
    } else {
        what += ", illegal instruction";
    }
    return where() + ": " + what + " in the kernel's code";
}
#endif

CAPSULE_EMU_INTERNAL inline void wait(Barrier& b, const char* kind, const Site& site) {
    Unobserved quiet;
    State& state = here();
    if (b.arrived == 0) {
        b.kind = kind;
        b.site = site;
    } else if (b.kind != kind || b.site.line() != site.line() ||
               (b.site.file_name() != site.file_name() && std::strcmp(b.site.file_name(), site.file_name()) != 0)) {
        abort_launch(where() + ": " + kind + " at " + site_text(site) + " while other threads wait at " + b.kind +
                     " at " + site_text(b.site) + " (a divergent barrier)");
    }
    const unsigned long generation = b.generation;
#if defined(CAPSULE_EMU_TSAN)
    __tsan_release(&b.sync[generation & 1]);
#endif
    state.progress = true;
    if (++b.arrived == b.size) {
        b.arrived = 0;
        ++b.generation;
    } else {
        state.current->waiting = &b;
        while (b.generation == generation) to_scheduler(state);
        state.current->waiting = nullptr;
    }
#if defined(CAPSULE_EMU_TSAN)
    __tsan_acquire(&b.sync[generation & 1]);
#endif
}

CAPSULE_EMU_INTERNAL inline void sync_block(const Site& site) { wait(*here().block_barrier, "__syncthreads", site); }

CAPSULE_EMU_INTERNAL inline Warp& my_warp() { return (*here().warps)[me().linear >> 5]; }

CAPSULE_EMU_INTERNAL inline uint64_t exchange(uint64_t bits, unsigned source_lane, const char* kind, const Site& site) {
    Unobserved quiet;
    const unsigned lane = me().linear & 31u;
    Warp& w = my_warp();
    // One barrier: the lanes write the slots of the parity of the generation they arrive in, which
    // no lane still reads (a lane reads slots only until it reaches the warp's next barrier, and
    // every lane reaches that one before any lane arrives in a generation of the same parity).
    uint64_t* slots = w.exchange[w.barrier.generation & 1];
    slots[lane] = bits;
    wait(w.barrier, kind, site);
    return source_lane < w.barrier.size ? slots[source_lane] : bits;
}

template <class T>
inline T shuffle(T v, unsigned source_lane, const char* kind, const Site& site) {
    static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= sizeof(uint64_t), "a shuffle moves up to 8 bytes");
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof v);
    bits = exchange(bits, source_lane, kind, site);
    T r;
    std::memcpy(&r, &bits, sizeof r);
    return r;
}

CAPSULE_EMU_INTERNAL inline void check_mask(unsigned mask, const char* kind, const Site& site) {
    Unobserved quiet;
    const unsigned size = my_warp().barrier.size;
    const unsigned full = size == 32 ? 0xffffffffu : (1u << size) - 1u;
    if (mask != full)
        abort_launch(where() + ": " + kind + " at " + site_text(site) + " with mask " + std::to_string(mask) +
                     "; the emulator runs whole warps only (mask of every lane)");
}

#if defined(CAPSULE_EMU_TSAN)
// Racecheck's TSan fibers and their stacks: two sets, taken by alternate blocks and kept across
// blocks and launches. Fresh fibers for every block cost far more than the kernel's own accesses
// (the runtime allocates and zeroes each new fiber's state: four fifths of a racecheck run of
// max_pool's backward, 4224 blocks of 256 threads), and TSan then ordered each block after the
// one before, so no race between blocks was ever reported (tests/test_sanitize.py). A set's stacks
// are its own fibers' (a stack another fiber had used would look to TSan like unordered writes).
// What reuse costs: the block after next runs on the same fibers, so TSan orders it after this
// one; a race between two blocks of one parity by the same thread index goes unseen, one between
// neighbouring blocks, or between other thread indices, does not.
struct FiberSet {
    std::vector<void*> tsan;
    char* stacks = nullptr;
    size_t stack_bytes = 0;
    unsigned n = 0;  // 0: rebuilt before its next block
};
inline FiberSet fiber_sets[2];
inline unsigned long blocks_run = 0;

// The set of the next block, with at least n fibers and stacks: a set is rebuilt only to grow.
// Rebuilding it for every change of block size (conv's launches alternate between sizes) cost
// racecheck half its run in TSan's zeroing of each new fiber's state and the page faults of it.
CAPSULE_EMU_INTERNAL inline FiberSet& next_fiber_set(unsigned n) {
    FiberSet& set = fiber_sets[blocks_run++ & 1];
    if (set.n >= n) return set;
    for (void* f : set.tsan)
        if (f) __tsan_destroy_fiber(f);
    if (set.stacks) munmap(set.stacks, set.stack_bytes);
    set.stack_bytes = size_t(n) * kStackBytes;
    set.stacks = static_cast<char*>(mmap(nullptr, set.stack_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (set.stacks == MAP_FAILED) std::abort();
    set.tsan.assign(n, nullptr);
    for (void*& f : set.tsan) f = __tsan_create_fiber(0);
    set.n = n;
    return set;
}
#endif

CAPSULE_EMU_INTERNAL inline void fiber_main() {
    State& state = here();
#if defined(CAPSULE_EMU_ASAN)
    __sanitizer_finish_switch_fiber(nullptr, &state.scheduler_bottom, &state.scheduler_size);
#endif
#if defined(CAPSULE_EMU_TSAN)
    __tsan_acquire(&state.launch_begin);
#endif
    try {
        state.body(state.body_data);
    } catch (const std::exception& e) {
        abort_launch(where() + ": an exception escaped the kernel (" + e.what() + ")");
    } catch (...) {
        abort_launch(where() + ": an exception escaped the kernel");
    }
#if defined(CAPSULE_EMU_TSAN)
    __tsan_release(&state.launch_end);
#endif
    state.current->done = true;
    state.progress = true;
    for (;;) to_scheduler(state);
}

#if !defined(CAPSULE_EMU_UCONTEXT)
// A new fiber's stack as capsule_emu_switch leaves a saved one: six zeroed registers, and
// fiber_main as the return address (the stack 16-byte aligned as after a call).
inline void* initial_stack(char* stack) {
    uintptr_t top = (reinterpret_cast<uintptr_t>(stack) + kStackBytes) & ~uintptr_t(15);
    auto* sp = reinterpret_cast<uint64_t*>(top - 64);
    for (int i = 0; i < 6; ++i) sp[i] = 0;
    sp[6] = reinterpret_cast<uint64_t>(&fiber_main);
    return sp;
}
#endif

// Unchecked by memcheck: the section holds AddressSanitizer's red zones between the variables.
// Static: each translation unit fills its own shared variables.
__attribute__((no_sanitize("address"))) CAPSULE_EMU_INTERNAL static inline void fill_shared() {
#if defined(CAPSULE_EMU_VALGRIND)
    // initcheck: shared memory is undefined at the start of every block, as far as valgrind knows.
    if (__start_capsule_emu_shared && __stop_capsule_emu_shared)
        VALGRIND_MAKE_MEM_UNDEFINED(__start_capsule_emu_shared, __stop_capsule_emu_shared - __start_capsule_emu_shared);
    VALGRIND_MAKE_MEM_UNDEFINED(state.dynamic_shared.data(), state.dynamic_shared.size());
    return;
#endif
#if defined(CAPSULE_EMU_SANITIZE)
    if (__start_capsule_emu_shared && __stop_capsule_emu_shared) {
        for (char* p = __start_capsule_emu_shared; p + 4 <= __stop_capsule_emu_shared; p += 4) std::memcpy(p, &kSharedFill, 4);
    }
#else
    for (char* p = &capsule_emu_shared_begin; p + 4 <= &capsule_emu_shared_end; p += 4) std::memcpy(p, &kSharedFill, 4);
#endif
    for (size_t i = 0; i + 4 <= state.dynamic_shared.size(); i += 4) std::memcpy(&state.dynamic_shared[i], &kSharedFill, 4);
}

CAPSULE_EMU_INTERNAL inline std::string deadlock_report() {
    std::vector<unsigned> exited;
    for (const Fiber& f : state.fibers)
        if (f.done) exited.push_back(f.linear);
    const auto describe = [&](Barrier* b, unsigned first, unsigned count, const char* unit) {
        std::vector<unsigned> arrived, elsewhere, gone;
        for (unsigned t = first; t < first + count; ++t) {
            const Fiber& f = state.fibers[t];
            (f.waiting == b ? arrived : f.done ? gone : elsewhere).push_back(t - first);
        }
        std::string s = std::string(b->kind) + " at " + site_text(b->site) + " reached by " + unit + " " + ranges(arrived) +
                        " of " + std::to_string(count);
        if (!gone.empty()) s += "; " + std::string(unit) + " " + ranges(gone) + " exited without reaching it";
        if (!elsewhere.empty()) s += "; " + std::string(unit) + " " + ranges(elsewhere) + " wait at another barrier";
        return s;
    };
    std::string s = std::string(state.kernel) + " block " + dims(state.block_index) + ": ";
    if (state.block_barrier->arrived > 0) return s + describe(state.block_barrier, 0, state.fibers.size(), "threads");
    for (size_t w = 0; w < state.warps->size(); ++w) {
        Barrier& b = (*state.warps)[w].barrier;
        if (b.arrived > 0) return s + "warp " + std::to_string(w) + ": " + describe(&b, 32 * w, b.size, "lanes");
    }
    return s + "threads deadlocked";
}

// What a launch that ran past its deadline was doing: the block and, per thread, running (in the
// kernel's code: a loop that never ends, or a spin on a flag no one sets), waiting at a barrier,
// or exited; and how many blocks had finished and had not started.
CAPSULE_EMU_INTERNAL inline std::string timeout_report(const Fiber* interrupted) {
    std::vector<unsigned> running, exited;
    std::vector<std::pair<Barrier*, std::vector<unsigned>>> waiting;
    for (const Fiber& f : state.fibers) {
        if (f.done) {
            exited.push_back(f.linear);
        } else if (f.waiting && &f != interrupted) {
            auto at = std::find_if(waiting.begin(), waiting.end(), [&](const auto& w) { return w.first == f.waiting; });
            if (at == waiting.end()) waiting.push_back({f.waiting, {f.linear}});
            else at->second.push_back(f.linear);
        } else {
            running.push_back(f.linear);
        }
    }
    const Launch& l = *state.launch;
    const uint64_t claimed = std::min(l.next.load(), l.total), finished = l.done.load();
    const uint64_t beside = claimed - finished - 1;  // other blocks running on other OS threads
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", state.timeout_seconds);
    std::string s = std::string(state.kernel) + " did not finish in " + seconds + " s (the launch timeout): block " +
                    dims(state.block_index) + " of grid " + dims(state.grid_dim) + " was running (" +
                    std::to_string(finished) + " of " + std::to_string(l.total) + " blocks finished, " +
                    (beside ? std::to_string(beside) + " others running, " : std::string()) +
                    std::to_string(l.total - claimed) + " not started); threads " + ranges(running) +
                    " still running in the kernel's code (a loop that never ends, or a spin on a flag no thread of "
                    "this block sets)";
    for (const auto& [barrier, threads] : waiting)
        s += "; threads " + ranges(threads) + " waiting at " + barrier->kind + " at " + site_text(barrier->site);
    if (!exited.empty()) s += "; threads " + ranges(exited) + " exited";
    return s;
}

// 0..n-1 in the order state.order asks for: as they come, reversed, or shuffled by state.order_seed
// (SplitMix64 over the seed, the block and `stream`: threads of each block get their own shuffle).
CAPSULE_EMU_INTERNAL inline std::vector<unsigned> schedule(unsigned n, uint64_t stream) {
    std::vector<unsigned> order(n);
    for (unsigned i = 0; i < n; ++i) order[i] = i;
    if (state.order == 1) {
        std::reverse(order.begin(), order.end());
    } else if (state.order == 2) {
        const dim3 b = stream ? state.block_index : dim3{0, 0, 0};
        uint64_t x = state.order_seed ^ (stream * 0x9E3779B97F4A7C15ull) ^ (uint64_t(b.x) << 1) ^ (uint64_t(b.y) << 22) ^
                     (uint64_t(b.z) << 43);
        for (unsigned i = n; i > 1; --i) {
            x += 0x9E3779B97F4A7C15ull;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
            z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
            z ^= z >> 31;
            std::swap(order[i - 1], order[z % i]);
        }
    }
    return order;
}

// A pointer the compiler cannot see through: GCC recomputes the address of a thread-local (a
// __tls_get_addr call, in a family library) wherever it would otherwise keep it in a register or
// spill it, such as after every switch to a fiber.
template <class T>
CAPSULE_EMU_INTERNAL inline T* opaque(T* p) {
    asm("" : "+r"(p));
    return p;
}

// Runs the current block to completion; false when it deadlocked or aborted (state.error says why).
CAPSULE_EMU_INTERNAL inline bool run_block(unsigned n) {
    State& state = *opaque(&capsule_emu::state);
    state.fibers.assign(n, Fiber{});
#if defined(CAPSULE_EMU_SANITIZE)
    if (state.stacks.size() < n) state.stacks.resize(n);
    if (fiber_locals.size() < n) fiber_locals.resize(n);
#else
    GuardedStacks& guarded_stacks = *opaque(&capsule_emu::guarded_stacks);
    if (!guarded_stacks.reserve(n)) {
        state.error = std::string(state.kernel) + " block " + dims(state.block_index) +
                      ": the emulator could not map the stacks of a block of " + std::to_string(n) + " threads (" +
                      std::strerror(errno) + "; vm.max_map_count bounds a process's mappings, two per kernel thread)";
        return false;
    }
#endif
    Barrier block_barrier;
    block_barrier.size = n;
    std::vector<Warp> warps((n + 31) / 32);
    for (unsigned w = 0; w < warps.size(); ++w) warps[w].barrier.size = (w + 1) * 32 <= n ? 32 : n - w * 32;
    state.block_barrier = &block_barrier;
    state.warps = &warps;
#if defined(CAPSULE_EMU_TSAN)
    // Every block its own shared memory, as far as TSan knows: fresh pages and a fresh allocation
    // reset its shadow, so one block's accesses never pair with the previous block's.
    if (__stop_capsule_emu_shared > __start_capsule_emu_shared &&
        mmap(__start_capsule_emu_shared, __stop_capsule_emu_shared - __start_capsule_emu_shared, PROT_READ | PROT_WRITE,
             MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED)
        std::abort();
    state.dynamic_shared = std::vector<unsigned char>(state.dynamic_shared.size());
#endif
    fill_shared();
#if defined(CAPSULE_EMU_TSAN)
    FiberSet& set = next_fiber_set(n);
#endif
    for (unsigned t = 0; t < n; ++t) {
        Fiber& f = state.fibers[t];
        f.thread = dim3{t % state.block_dim.x, (t / state.block_dim.x) % state.block_dim.y,
                        t / (state.block_dim.x * state.block_dim.y)};
        f.linear = t;
#if defined(CAPSULE_EMU_TSAN)
        char* stack_base = set.stacks + size_t(t) * kStackBytes;
#elif !defined(CAPSULE_EMU_SANITIZE)
        char* stack_base = guarded_stacks.stack(t);
        guarded_stacks.header(t).fiber = &f;  // its fiber_local bytes stay as the thread's last block left them
        guarded_stacks.header(t).state = &state;
#else
        std::vector<char>& stack = state.stacks[t];
        if (stack.size() != kStackBytes) {
            stack.assign(kStackBytes, 0);
#if defined(CAPSULE_EMU_VALGRIND)
            VALGRIND_STACK_REGISTER(stack.data(), stack.data() + stack.size());
#endif
        }
        char* stack_base = stack.data();
#endif
#if defined(CAPSULE_EMU_ASAN)
        // A finished fiber leaves the frames it ends in (fiber_main's, to_scheduler's) poisoned at
        // the top of its stack; a block that ended in an error, frames anywhere.
        f.stack_bottom = stack_base;
        const size_t top = state.stacks_dirty ? kStackBytes : 16384;
        __asan_unpoison_memory_region(stack_base + kStackBytes - top, top);
#endif
#if defined(CAPSULE_EMU_UCONTEXT)
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = stack_base;
        f.context.uc_stack.ss_size = kStackBytes;
        f.context.uc_link = nullptr;
        makecontext(&f.context, &fiber_main, 0);
#else
        f.sp = initial_stack(stack_base);
#endif
#if defined(CAPSULE_EMU_TSAN)
        f.tsan = set.tsan[t];
        const std::string name = "block " + dims(state.block_index) + " thread " + dims(f.thread);
        __tsan_set_fiber_name(f.tsan, name.c_str());  // copied by TSan
#endif
    }
#if defined(CAPSULE_EMU_TSAN)
    __tsan_release(&state.launch_begin);  // the block's set-up (its stacks) before its threads
#endif
    bool ok = true;
    const std::vector<unsigned> turn = schedule(n, 1);
    for (unsigned live = n; live > 0 && ok;) {
        state.progress = false;
        live = 0;
        for (unsigned t : turn) {
            Fiber& f = state.fibers[t];
            if (f.done) continue;
            to_fiber(state, f);
            if (state.timed_out && state.error.empty()) {
                state.error = timeout_report(&f);
                ok = false;
                break;
            }
            if (state.aborted) {
#if !defined(CAPSULE_EMU_SANITIZE)
                if (state.fault_signal && state.error.empty()) state.error = fault_report();
#endif
                ok = false;
                break;
            }
            if (!f.done) ++live;
        }
        if (ok && live > 0 && !state.progress) {
            state.current = nullptr;
            state.error = deadlock_report();
            ok = false;
        }
    }
    state.current = nullptr;
#if defined(CAPSULE_EMU_ASAN)
    state.stacks_dirty = !ok;
#endif
#if defined(CAPSULE_EMU_TSAN)
    if (!ok) {
        // An abandoned fiber is inside the emulator with TSan's ignores on: never run it again.
        for (unsigned t = 0; t < n; ++t)
            if (!state.fibers[t].done) set.tsan[t] = nullptr;
        set.n = 0;
    }
#endif
    return ok;
}

template <class F>
void call_body(const void* data) {
    (*static_cast<const F*>(data))();
}

// A failure's error text and fault, from a thread's state to its launch and back to the launching
// thread's state.
template <class To, class From>
void copy_failure(To& to, const From& from) {
    to.error = from.error;
    to.fault_signal = from.fault_signal, to.fault_code = from.fault_code, to.fault_access = from.fault_access;
    to.fault_address = from.fault_address, to.fault_pc = from.fault_pc;
    to.timed_out = from.timed_out;
}

// The floating-point environment of kernel code for as long as an OS thread runs blocks: round to
// nearest, subnormals kept (no flush to zero), exceptions masked, as on a GPU; then the caller's
// again. Kernel code cannot change it, so fibers need not carry it (swapcontext, elsewhere, does).
struct KernelFloatingPoint {
#if !defined(CAPSULE_EMU_UCONTEXT)
    uint32_t mxcsr;
    uint16_t x87;
    KernelFloatingPoint() {
        asm volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(x87));
        set(0x1F80u, 0x037Fu);
    }
    ~KernelFloatingPoint() { set(mxcsr, x87); }
    static void set(uint32_t sse, uint16_t x87_word) { asm volatile("ldmxcsr %0\n\tfldcw %1" ::"m"(sse), "m"(x87_word)); }
#endif
};

// This OS thread's part of launch l: it claims blocks in the schedule's order until none is left
// or a block has failed (here or on another thread), and records a failure for the launch (the
// first in the schedule wins, so the error does not depend on which threads ran beside it).
CAPSULE_EMU_INTERNAL inline void run_blocks(Launch& l) {
    KernelFloatingPoint floating_point;
    State& state = *opaque(&capsule_emu::state);
    state.launch = &l;
    state.kernel = l.kernel;
    state.grid_dim = l.grid_dim;
    state.block_dim = l.block_dim;
    state.dynamic_bytes = l.dynamic_bytes;
    state.body = l.body;
    state.body_data = l.body_data;
    state.order = l.order;
    state.order_seed = l.order_seed;
    state.timeout_seconds = l.timeout_seconds;
    state.error.clear();
    state.aborted = false;
    state.fault_signal = state.fault_code = state.fault_access = 0;
    state.fault_address = state.fault_pc = nullptr;
    state.dynamic_shared.assign((l.dynamic_bytes + 15) / 16 * 16 + 16, 0);
#if defined(CAPSULE_EMU_TSAN)
    state.host_fiber = __tsan_get_current_fiber();
#endif
#if !defined(CAPSULE_EMU_SANITIZE)
    Watchdog watchdog(l.timeout_seconds);
#endif
    const unsigned n = l.block_dim.x * l.block_dim.y * l.block_dim.z;
    while (!l.stop.load(std::memory_order_relaxed)) {
        const uint64_t i = l.next.fetch_add(1);
        if (i >= l.total) break;
        state.block_index = l.block_at(i);
        if (run_block(n)) {
            l.done.fetch_add(1);
            continue;
        }
        std::lock_guard<std::mutex> guard(l.failure_lock);
        if (i < l.failed_at) {
            l.failed_at = i;
            copy_failure(l, state);
        }
        l.stop = true;
        break;
    }
    state.launch = nullptr;
}

#if !defined(CAPSULE_EMU_SANITIZE)
// How many OS threads run the blocks of a launch (capsule_emu_set_threads; the launching thread is
// one of them).
inline std::atomic<unsigned> threads_wanted{1};

// The OS threads that run blocks beside the launching one, kept across launches and shared by every
// family library loaded (pool()), as a GPU's SMs serve every module. They take no
// asynchronous signal (the host's SIGINT and SIGTERM go to its own threads), only the faults of
// their kernel threads and their watchdogs' SIGVTALRM, on a signal stack of their own.
struct Pool {
    std::mutex lock;
    std::condition_variable wake, finished;
    unsigned started = 0;
    unsigned long generation = 0;  // one per launch handed out
    Launch* job = nullptr;
    unsigned helpers = 0;  // how many of the threads take part in the current launch
    unsigned running = 0;  // of those, how many have not finished their part
    pid_t owner = getpid();
    std::mutex busy;  // held by the launch the pool is running (another thread's launch runs alone)

    void serve(unsigned index) {
        std::vector<char> own_stack(kSignalStackBytes);
        stack_t alternate{};
        alternate.ss_sp = own_stack.data();
        alternate.ss_size = own_stack.size();
        sigaltstack(&alternate, nullptr);
        sigset_t wanted;
        sigemptyset(&wanted);
        for (int signo : kFaultSignals) sigaddset(&wanted, signo);
        sigaddset(&wanted, SIGVTALRM);
        pthread_sigmask(SIG_UNBLOCK, &wanted, nullptr);
        unsigned long seen = 0;
        for (;;) {
            Launch* l;
            {
                std::unique_lock<std::mutex> hold(lock);
                wake.wait(hold, [&] { return generation != seen; });
                seen = generation;
                if (index >= helpers) continue;
                l = job;
            }
            launching = true;
            l->run(*l);
            launching = false;
            std::lock_guard<std::mutex> hold(lock);
            if (--running == 0) finished.notify_all();
        }
    }

    // Runs launch l on the calling thread and `count` pool threads, and returns when all are done.
    void run(Launch& l, unsigned count) {
        {
            std::lock_guard<std::mutex> hold(lock);
            if (started < count) {
                sigset_t all, saved;
                sigfillset(&all);
                pthread_sigmask(SIG_BLOCK, &all, &saved);
                for (; started < count; ++started) std::thread([this, index = started] { serve(index); }).detach();
                pthread_sigmask(SIG_SETMASK, &saved, nullptr);
            }
            job = &l;
            helpers = running = count;
            ++generation;
        }
        wake.notify_all();
        run_blocks(l);
        std::unique_lock<std::mutex> hold(lock);
        finished.wait(hold, [&] { return running == 0; });
        job = nullptr;
    }
};

// The process's pool: the static of an inline function, so one object (a GNU unique symbol, like
// state) whichever library asks. A pool per library cost each library its own threads, and each
// thread its own fibers' stacks, two mappings per kernel thread (stack and guard page): a pytest
// run on two cores reached 30,000 of the 65,530 mappings vm.max_map_count allows. A forked child
// has none of its parent's threads, so it starts another.
inline Pool& pool() {
    static std::atomic<Pool*> current{new Pool};
    Pool* p = current.load();
    if (p->owner != getpid()) current = p = new Pool;
    return *p;
}
#endif

// Runs kernel(args...) over grid x block with `shared` bytes of dynamic shared memory; false with
// state.error set when a barrier diverged, a thread trapped or an access was misaligned.
template <class... P, class... A>
bool launch(const char* name, dim3 grid, dim3 block, unsigned shared, void (*kernel)(P...), A... args) {
    Unobserved quiet;
    Launch l;
    l.kernel = name;
    l.grid_dim = grid;
    l.block_dim = block;
    l.dynamic_bytes = shared;
    l.order = state.order;
    l.order_seed = state.order_seed;
    l.timeout_seconds = state.timeout_seconds;
    auto body = [&]() { kernel(static_cast<P>(args)...); };
    l.body = &call_body<decltype(body)>;
    l.body_data = &body;
    l.total = uint64_t(grid.x) * grid.y * grid.z;
    if (l.order != 0 && l.total <= (uint64_t(1) << 26)) l.blocks = schedule(static_cast<unsigned>(l.total), 0);  // a huge grid is not shuffled
#if defined(CAPSULE_EMU_SANITIZE)
    run_blocks(l);
#else
    FaultHandlers faults;
    l.run = &run_blocks;
    const unsigned threads = static_cast<unsigned>(std::min<uint64_t>(threads_wanted.load(), l.total));
    Pool& helpers = pool();
    if (threads > 1 && helpers.busy.try_lock()) {
        helpers.run(l, threads - 1);
        helpers.busy.unlock();
    } else {
        run_blocks(l);
    }
#endif
    // The launch's result, as the launching thread's state (capsule_emu_error and the fault read it).
    state.kernel = name;
    copy_failure(state, l);
    state.current = nullptr;
    state.order = 0;  // one state per OS thread, shared by every family library loaded: no schedule outlives its launch
#if defined(CAPSULE_EMU_TSAN)
    __tsan_acquire(&state.launch_end);
#endif
    return l.failed_at == UINT64_MAX;
}

}  // namespace capsule_emu

namespace capsule_emu {
// What kernel code reads of the emulator's state, through functions racecheck does not instrument
// (the scheduler writes it between fibers; that is no race of the kernel's).
CAPSULE_EMU_INTERNAL inline dim3 thread_idx() { return me().thread; }
CAPSULE_EMU_INTERNAL inline dim3 block_idx() { return here().block_index; }
CAPSULE_EMU_INTERNAL inline dim3 block_dim() { return here().block_dim; }
CAPSULE_EMU_INTERNAL inline dim3 grid_dim() { return here().grid_dim; }
CAPSULE_EMU_INTERNAL inline unsigned lane() { return me().linear & 31u; }
}  // namespace capsule_emu

#define threadIdx (capsule_emu::thread_idx())
#define blockIdx (capsule_emu::block_idx())
#define blockDim (capsule_emu::block_dim())
#define gridDim (capsule_emu::grid_dim())
#define warpSize 32

// The block's dynamic shared memory and its size (common.cuh takes these from the emulator).
CAPSULE_EMU_INTERNAL inline unsigned char* capsule_emu_dynamic_shared() {
    return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(capsule_emu::here().dynamic_shared.data()) + 15) & ~uintptr_t(15));
}
CAPSULE_EMU_INTERNAL inline unsigned capsule_emu_dynamic_shared_bytes() { return capsule_emu::here().dynamic_bytes; }

inline void __syncthreads(capsule_emu::Site site = capsule_emu::Site::current()) { capsule_emu::sync_block(site); }

inline void __syncwarp(unsigned mask = 0xffffffffu, capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::check_mask(mask, "__syncwarp", site);
    capsule_emu::wait(capsule_emu::my_warp().barrier, "__syncwarp", site);
}

[[noreturn]] inline void __trap(capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::abort_launch(capsule_emu::where() + ": __trap() at " + capsule_emu::site_text(site));
}

// A failed assert() in device code ends the launch, as CUDA's "device-side assert triggered" does
// (glibc's would abort the process).
extern "C" [[noreturn]] inline void __assert_fail(const char* expression, const char* file, unsigned line,
                                                  const char* function) noexcept {
    const char* slash = std::strrchr(file, '/');
    capsule_emu::abort_launch(capsule_emu::where() + ": assert(" + expression + ") failed at " + (slash ? slash + 1 : file) +
                              ":" + std::to_string(line) + " in " + function);
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int offset, int width = 32, capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::check_mask(mask, "__shfl_xor_sync", site);
    const unsigned lane = capsule_emu::lane();
    return capsule_emu::shuffle(v, lane ^ static_cast<unsigned>(offset), "__shfl_xor_sync", site);
}

template <class T>
inline T __shfl_sync(unsigned mask, T v, int src, int width = 32, capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::check_mask(mask, "__shfl_sync", site);
    const unsigned lane = capsule_emu::lane();
    const unsigned base = lane & ~static_cast<unsigned>(width - 1);
    return capsule_emu::shuffle(v, base + (static_cast<unsigned>(src) & static_cast<unsigned>(width - 1)), "__shfl_sync", site);
}

template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32,
                          capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::check_mask(mask, "__shfl_down_sync", site);
    const unsigned lane = capsule_emu::lane();
    const unsigned in_group = lane & static_cast<unsigned>(width - 1);
    return capsule_emu::shuffle(v, in_group + delta < static_cast<unsigned>(width) ? lane + delta : lane, "__shfl_down_sync", site);
}

template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32, capsule_emu::Site site = capsule_emu::Site::current()) {
    capsule_emu::check_mask(mask, "__shfl_up_sync", site);
    const unsigned lane = capsule_emu::lane();
    const unsigned in_group = lane & static_cast<unsigned>(width - 1);
    return capsule_emu::shuffle(v, in_group >= delta ? lane - delta : lane, "__shfl_up_sync", site);
}

namespace capsule_emu {
// Ends the launch, as the GPU's "misaligned address" fault does.
[[noreturn]] inline void misaligned_access(uintptr_t pointer, uintptr_t alignment, const char* file, unsigned line) {
    const char* slash = std::strrchr(file, '/');
    char address[32];
    std::snprintf(address, sizeof address, "%lx", static_cast<unsigned long>(pointer));
    abort_launch(where() + ": misaligned " + std::to_string(alignment) + "-byte access at address 0x" + address + " at " +
                 (slash ? slash + 1 : file) + ":" + std::to_string(line));
}

// The alignment a GPU's vector access needs, tested by hand where emulator code moves the vector
// without a typed access (memcpy), so that the loop around it may go without UBSan's per-access
// checks, which keep g++ from vectorising it (linalg.cuh's multiply).
inline void require_aligned(const void* p, uintptr_t bytes, Site site = Site::current()) {
    const uintptr_t pointer = reinterpret_cast<uintptr_t>(p);
    if (__builtin_expect(pointer % bytes != 0, 0)) misaligned_access(pointer, bytes, site.file_name(), site.line());
}
}  // namespace capsule_emu

#if !defined(CAPSULE_EMU_SANITIZE)
// The handler of -fsanitize=alignment (UBSan's ABI): a misaligned typed access ends the launch, as
// the GPU's "misaligned address" fault does. Sanitizer builds use UBSan's own runtime instead.
extern "C" {
struct capsule_emu_ubsan_location {
    const char* file;
    uint32_t line, column;
};
struct capsule_emu_ubsan_mismatch {
    capsule_emu_ubsan_location location;
    const void* type;
    unsigned char log_alignment;
    unsigned char kind;
};
// Built with -fno-sanitize-recover=alignment, the checks call the _abort form, which never returns:
// the compiler can then keep a loop's values in registers across the checks (an SGEMM's
// accumulators), as it cannot around a call that may return and may have written memory.
[[noreturn]] __attribute__((visibility("default"))) void __ubsan_handle_type_mismatch_v1_abort(capsule_emu_ubsan_mismatch* data,
                                                                                                uintptr_t pointer) {
    capsule_emu::misaligned_access(pointer, uintptr_t(1) << data->log_alignment, data->location.file, data->location.line);
}
__attribute__((visibility("default"))) void __ubsan_handle_type_mismatch_v1(capsule_emu_ubsan_mismatch* data, uintptr_t pointer) {
    const uintptr_t alignment = uintptr_t(1) << data->log_alignment;
    if (pointer == 0 || (pointer & (alignment - 1)) == 0) return;
    __ubsan_handle_type_mismatch_v1_abort(data, pointer);
}
}
#endif

// -- atomics ------------------------------------------------------------------------------------
// CUDA's atomic functions, each returning the old value, on the types CUDA has them for (another
// type is a compile error, as under nvcc). The emulator switches threads only at barriers and
// shuffles, so one read-modify-write is never interleaved; the __atomic builtins make each an
// atomic to ThreadSanitizer as well, so racecheck sees synchronisation, not a race. A misaligned
// address ends the launch, as it faults on a GPU.
namespace capsule_emu {
template <class T, class... Allowed>
inline constexpr bool one_of = (std::is_same_v<T, Allowed> || ...);

template <class T, class F>
inline T atomic_update(T* address, const char* name, F f, Site site) {
    if (reinterpret_cast<uintptr_t>(address) % sizeof(T) != 0)
        abort_launch(where() + ": misaligned " + name + " at " + site_text(site));
    T old;
    __atomic_load(address, &old, __ATOMIC_RELAXED);
    for (;;) {
        T desired = f(old);
        if (__atomic_compare_exchange(address, &old, &desired, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return old;
    }
}
}  // namespace capsule_emu

#define CAPSULE_EMU_ATOMIC(NAME, TYPES, OP)                                                                        \
    template <class T>                                                                                             \
    inline T NAME(T* address, std::type_identity_t<T> val, capsule_emu::Site site = capsule_emu::Site::current()) { \
        static_assert(capsule_emu::one_of<T, TYPES>, #NAME " has no overload for this type in CUDA");             \
        return capsule_emu::atomic_update(address, #NAME, [val](T old) -> T { return OP; }, site);               \
    }

#define CAPSULE_EMU_COMMA ,
CAPSULE_EMU_ATOMIC(atomicAdd, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int CAPSULE_EMU_COMMA float CAPSULE_EMU_COMMA double, old + val)
CAPSULE_EMU_ATOMIC(atomicSub, int CAPSULE_EMU_COMMA unsigned int, old - val)
CAPSULE_EMU_ATOMIC(atomicExch, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int CAPSULE_EMU_COMMA float, ((void)old, val))
CAPSULE_EMU_ATOMIC(atomicMin, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int CAPSULE_EMU_COMMA long long int, val < old ? val : old)
CAPSULE_EMU_ATOMIC(atomicMax, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int CAPSULE_EMU_COMMA long long int, val > old ? val : old)
CAPSULE_EMU_ATOMIC(atomicInc, unsigned int, old >= val ? 0u : old + 1u)
CAPSULE_EMU_ATOMIC(atomicDec, unsigned int, (old == 0u || old > val) ? val : old - 1u)
CAPSULE_EMU_ATOMIC(atomicAnd, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int, old & val)
CAPSULE_EMU_ATOMIC(atomicOr, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int, old | val)
CAPSULE_EMU_ATOMIC(atomicXor, int CAPSULE_EMU_COMMA unsigned int CAPSULE_EMU_COMMA unsigned long long int, old ^ val)
#undef CAPSULE_EMU_ATOMIC
#undef CAPSULE_EMU_COMMA

template <class T>
inline T atomicCAS(T* address, std::type_identity_t<T> compare, std::type_identity_t<T> val,
                   capsule_emu::Site site = capsule_emu::Site::current()) {
    static_assert(capsule_emu::one_of<T, int, unsigned int, unsigned long long int, unsigned short int>,
                  "atomicCAS has no overload for this type in CUDA");
    return capsule_emu::atomic_update(address, "atomicCAS", [&](T old) -> T { return old == compare ? val : old; }, site);
}
