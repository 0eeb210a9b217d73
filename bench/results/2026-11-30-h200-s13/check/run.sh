scripts/device-session-check check .device/s13/bin.tar.xz  # binaries of 9815182 (ce3ae62's kernels + ms_single by a host hold)
