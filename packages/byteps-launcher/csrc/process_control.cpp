// byteps.launcher._C: the Linux process-control calls bpslaunch needs and
// Python's standard library does not offer.
//
// Why C++: prctl(PR_SET_PDEATHSIG) / prctl(PR_SET_CHILD_SUBREAPER) have no
// Python binding, and the group reaper must run after fork() without ever
// touching the interpreter again (only async-signal-safe calls), which is
// impossible to guarantee from Python code.
//
//   set_parent_death_signal  child side of "no orphans": the kernel kills the
//                            child when bpslaunch dies, even by SIGKILL.
//   set_child_subreaper      orphaned grandchildren are re-parented to
//                            bpslaunch, which can then find and reap them.
//   start_group_reaper       a tiny forked watchdog that SIGKILLs every
//                            registered process group once bpslaunch is gone
//                            (covers grandchildren, which the death signal
//                            does not reach).
//   set/get_cpu_affinity     sched_setaffinity/sched_getaffinity on any pid.

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cerrno>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <sched.h>
#include <string>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>
#include <vector>

namespace py = pybind11;

namespace {

// Raise OSError(errno, "<strerror> (<what>)"); Python picks the subclass
// (ProcessLookupError for ESRCH, PermissionError for EPERM, ...).
[[noreturn]] void throw_os_error(int err, const std::string& what) {
    py::object os_error = py::module_::import("builtins").attr("OSError");
    std::string message = std::string(std::strerror(err)) + " (" + what + ")";
    PyErr_SetObject(os_error.ptr(), py::make_tuple(err, message).ptr());
    throw py::error_already_set();
}

void check_signal(int sig) {
    if (sig <= 0 || sig >= NSIG) {
        throw py::value_error("signal must be in 1.." + std::to_string(NSIG - 1) + ", got " +
                              std::to_string(sig));
    }
}

// Meant for Popen(preexec_fn=...): runs in the forked child before exec.
void set_parent_death_signal(int sig, long expected_parent) {
    check_signal(sig);
    if (prctl(PR_SET_PDEATHSIG, static_cast<unsigned long>(sig), 0, 0, 0) != 0) {
        throw_os_error(errno, "prctl(PR_SET_PDEATHSIG, " + std::to_string(sig) + ")");
    }
    // The classic race: if the parent died between fork() and the prctl
    // above, the death signal will never come because we have already been
    // re-parented. Die now instead of running as an orphan.
    if (static_cast<long>(getppid()) != expected_parent) {
        _exit(128 + sig);
    }
}

int get_parent_death_signal() {
    int sig = 0;
    if (prctl(PR_GET_PDEATHSIG, &sig, 0, 0, 0) != 0) {
        throw_os_error(errno, "prctl(PR_GET_PDEATHSIG)");
    }
    return sig;
}

void set_child_subreaper(bool enabled) {
    if (prctl(PR_SET_CHILD_SUBREAPER, enabled ? 1UL : 0UL, 0, 0, 0) != 0) {
        throw_os_error(errno, "prctl(PR_SET_CHILD_SUBREAPER)");
    }
}

bool is_child_subreaper() {
    int value = 0;
    if (prctl(PR_GET_CHILD_SUBREAPER, &value, 0, 0, 0) != 0) {
        throw_os_error(errno, "prctl(PR_GET_CHILD_SUBREAPER)");
    }
    return value != 0;
}

// ---------------------------------------------------------------- affinity

std::string cpus_text(const std::vector<int>& cpus) {
    std::string text = "[";
    for (size_t i = 0; i < cpus.size(); ++i) {
        text += (i ? ", " : "") + std::to_string(cpus[i]);
    }
    return text + "]";
}

void set_cpu_affinity(long pid, const std::vector<int>& cpus) {
    if (cpus.empty()) {
        throw py::value_error("cpus must not be empty: a process needs at least one CPU");
    }
    int highest = 0;
    for (int cpu : cpus) {
        if (cpu < 0) {
            throw py::value_error("cpu ids must be >= 0, got " + std::to_string(cpu));
        }
        highest = cpu > highest ? cpu : highest;
    }
    cpu_set_t* set = CPU_ALLOC(highest + 1);
    if (set == nullptr) {
        throw std::bad_alloc();
    }
    size_t size = CPU_ALLOC_SIZE(highest + 1);
    CPU_ZERO_S(size, set);
    for (int cpu : cpus) {
        CPU_SET_S(cpu, size, set);
    }
    int rc = sched_setaffinity(static_cast<pid_t>(pid), size, set);
    int err = errno;
    CPU_FREE(set);
    if (rc != 0) {
        std::string what = "sched_setaffinity(pid=" + std::to_string(pid) + ", cpus=" + cpus_text(cpus) + ")";
        if (err == EINVAL) {
            what += "; none of these CPUs is online and allowed for this process";
        }
        throw_os_error(err, what);
    }
}

std::vector<int> get_cpu_affinity(long pid) {
    // The kernel's mask may be wider than CPU_SETSIZE; grow until it fits.
    for (int ncpus = 1024; ncpus <= (1 << 22); ncpus *= 2) {
        cpu_set_t* set = CPU_ALLOC(ncpus);
        if (set == nullptr) {
            throw std::bad_alloc();
        }
        size_t size = CPU_ALLOC_SIZE(ncpus);
        CPU_ZERO_S(size, set);
        if (sched_getaffinity(static_cast<pid_t>(pid), size, set) == 0) {
            std::vector<int> cpus;
            for (int cpu = 0; cpu < ncpus; ++cpu) {
                if (CPU_ISSET_S(cpu, size, set)) {
                    cpus.push_back(cpu);
                }
            }
            CPU_FREE(set);
            return cpus;
        }
        int err = errno;
        CPU_FREE(set);
        if (err != EINVAL) {
            throw_os_error(err, "sched_getaffinity(pid=" + std::to_string(pid) + ")");
        }
    }
    throw_os_error(EINVAL, "sched_getaffinity(pid=" + std::to_string(pid) + "): CPU mask too large");
}

// ------------------------------------------------------------ group reaper

constexpr int kMaxGroups = 65536;

void close_other_fds(int keep) {
    // close_range(2) where the kernel has it; otherwise one close per slot.
#ifdef SYS_close_range
    bool done = true;
    if (keep > 3 && syscall(SYS_close_range, 3U, static_cast<unsigned>(keep - 1), 0U) != 0) done = false;
    if (done && syscall(SYS_close_range, static_cast<unsigned>(keep + 1), ~0U, 0U) != 0) done = false;
    if (done) return;
#endif
    struct rlimit limit;
    long top = 65536;
    if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY &&
        static_cast<long>(limit.rlim_cur) < top) {
        top = static_cast<long>(limit.rlim_cur);
    }
    for (long fd = 3; fd < top; ++fd) {
        if (fd != keep) close(static_cast<int>(fd));
    }
}

// Body of the reaper process. Only async-signal-safe calls: the parent may
// have had other threads, whose locks (malloc, the GIL) are gone here.
[[noreturn]] void run_group_reaper(int read_fd) {
    static pid_t groups[kMaxGroups];
    int count = 0;

    if (read_fd <= 2) {  // keep it clear of the stdio slots we are about to overwrite
        int moved = fcntl(read_fd, F_DUPFD, 3);
        if (moved >= 0) read_fd = moved;
    }
    setsid();  // out of bpslaunch's process group: a kill of that group must not take us too
    prctl(PR_SET_NAME, "bpslaunch-reap", 0, 0, 0);
    struct sigaction action;
    std::memset(&action, 0, sizeof(action));
    action.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGCHLD, SIGPIPE}) sigaction(sig, &action, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);

    int devnull = open("/dev/null", O_RDWR);
    if (devnull >= 0) {
        dup2(devnull, 0);
        dup2(devnull, 1);
        dup2(devnull, 2);
        if (devnull > 2) close(devnull);
    }
    close_other_fds(read_fd);

    int32_t message = 0;
    size_t have = 0;
    for (;;) {
        ssize_t n = read(read_fd, reinterpret_cast<char*>(&message) + have, sizeof(message) - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // EOF: bpslaunch is gone (or closed us without disarming)
        have += static_cast<size_t>(n);
        if (have < sizeof(message)) continue;
        have = 0;
        if (message == 0) _exit(0);  // disarmed: bpslaunch cleaned up itself
        if (message > 0 && count < kMaxGroups) {
            groups[count++] = message;
        } else if (message < 0) {
            for (int i = 0; i < count; ++i) {
                if (groups[i] == -message) {
                    groups[i] = groups[--count];
                    break;
                }
            }
        }
    }
    for (int i = 0; i < count; ++i) kill(-groups[i], SIGKILL);
    _exit(0);
}

// Fork the reaper; returns (pid, write end). The caller writes native int32
// messages: pgid > 0 registers a group, -pgid forgets it, 0 disarms.
py::tuple start_group_reaper() {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        throw_os_error(errno, "pipe2 for the group reaper");
    }
    // A second pipe tells us when the reaper has left our session: only then
    // is it safe from a kill aimed at bpslaunch's process group.
    int ready[2];
    if (pipe2(ready, O_CLOEXEC) != 0) {
        int err = errno;
        close(fds[0]);
        close(fds[1]);
        throw_os_error(err, "pipe2 for the group reaper");
    }
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        for (int fd : {fds[0], fds[1], ready[0], ready[1]}) close(fd);
        throw_os_error(err, "fork of the group reaper");
    }
    if (pid == 0) {
        close(fds[1]);
        close(ready[0]);
        run_group_reaper(fds[0]);  // closes ready[1] once set up
    }
    close(fds[0]);
    close(ready[1]);
    char byte;
    while (read(ready[0], &byte, 1) < 0 && errno == EINTR) {
    }
    close(ready[0]);
    return py::make_tuple(static_cast<long>(pid), fds[1]);
}

}  // namespace

PYBIND11_MODULE(_C, m) {
    m.doc() = "Linux process control for bpslaunch: parent-death signal, subreaper, group reaper, CPU affinity.";
    m.def("set_parent_death_signal", &set_parent_death_signal, py::arg("signal"), py::arg("expected_parent"),
          "prctl(PR_SET_PDEATHSIG) in a freshly forked child (Popen preexec_fn); _exit at once if the "
          "parent is already not expected_parent.");
    m.def("get_parent_death_signal", &get_parent_death_signal,
          "The calling process's parent-death signal (0 when none).");
    m.def("set_child_subreaper", &set_child_subreaper, py::arg("enabled") = true,
          "prctl(PR_SET_CHILD_SUBREAPER): orphaned descendants are re-parented to this process.");
    m.def("is_child_subreaper", &is_child_subreaper, "Whether this process is a child subreaper.");
    m.def("set_cpu_affinity", &set_cpu_affinity, py::arg("pid"), py::arg("cpus"),
          "sched_setaffinity: restrict pid (0 = the caller) to the given logical CPUs.");
    m.def("get_cpu_affinity", &get_cpu_affinity, py::arg("pid"),
          "sched_getaffinity: the sorted logical CPUs pid (0 = the caller) may run on.");
    m.def("start_group_reaper", &start_group_reaper,
          "Fork a watchdog that SIGKILLs registered process groups when its pipe closes. "
          "Returns (pid, write_fd).");
}
