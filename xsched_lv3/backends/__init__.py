"""HwQueue backends: sim (a virtual GPU), torch (CUDA/HIP streams), kfd (Lv3 through KFD CWSR)."""
