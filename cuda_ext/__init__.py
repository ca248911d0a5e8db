"""C++ (CPU) and CUDA kernels of the DLAC codec, JIT-built by lightning_dlac.codec."""
