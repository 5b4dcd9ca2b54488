"""Reading a target process's memory: the CWSR save-area header the kernel writes on suspend
(kfd_context_save_area_header at ctx_save_restore_address). Real: /proc/<pid>/mem (needs ptrace
access). Simulated: the simulator keeps what its kernel wrote into the process's buffers."""
import os


class ProcessMemory:
    def __init__(self, pid):
        self.pid = pid

    def read(self, addr, length):
        try:
            fd = os.open(f"/proc/{self.pid}/mem", os.O_RDONLY)
        except OSError:
            return None
        try:
            data = os.pread(fd, length, addr)
        except (OSError, OverflowError):
            return None
        finally:
            os.close(fd)
        return data if len(data) == length else None


class SimProcessMemory:
    def __init__(self, machine, pid):
        self.machine, self.pid = machine, pid

    def read(self, addr, length):
        with self.machine.control() as ctl:
            try:
                data = ctl("read_memory", pid=self.pid, addr=addr, length=length)["data"]
            except Exception:
                return None
        return bytes.fromhex(data) if data else None


def memory_for(kfd, pid):
    machine = getattr(kfd.backend, "machine", None)
    return SimProcessMemory(machine, pid) if machine is not None else ProcessMemory(pid)
