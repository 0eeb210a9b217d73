#!/usr/bin/env bash
# Session 12 call 10: two same-run samples of the 128K RR S 8 total against cuDNN, a797e68's binaries.
scripts/device-session-check ratio .device/s12g/bin.tar.xz 2
