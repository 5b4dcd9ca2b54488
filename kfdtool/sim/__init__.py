"""The simulated KFD: machines, the kernel model, its server and clients."""
ABIS = ("1.11", "1.17", "1.23")      # KFD ABI versions a simulated machine can speak (see machine.PROFILES)
