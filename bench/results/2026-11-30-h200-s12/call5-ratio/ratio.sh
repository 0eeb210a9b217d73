#!/usr/bin/env bash
# Session 12 call 5: three same-run samples of the 128K RR S 8 total against cuDNN, 4e7cd93's binaries.
scripts/device-session-check ratio .device/s12d/bin.tar.xz 3
