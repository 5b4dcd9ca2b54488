"""The kfdtool commands: name -> (implementing module, one-line help), in `--help` order."""

COMMANDS = {
    "topology": ("topology_cmd", "show KFD topology nodes (GPUs, CPUs, links)"),
    "queues": ("queues_cmd", "list KFD processes and their GPU queues"),
    "monitor": ("monitor_cmd", "live view of KFD processes and queues (Ctrl-C to quit)"),
    "cwsr": ("cwsr_cmd", "CWSR facts: amdgpu parameters, per-GPU save-area sizes, per-queue save-area memory"),
    "preempt": ("preempt_cmd", "suspend a process's GPU queues (CWSR wave save) and resume them"),
    "resume": ("preempt_cmd", "resume a process's suspended GPU queues (recovery)"),
    "sim": ("sim_cmd", "run a simulated KFD machine (no AMD GPU needed)"),
    "demo": ("demo_cmd", "start a simulated MI308X host with GPU processes and show what kfdtool sees"),
}


def help_for(name):
    return COMMANDS[name][1]
