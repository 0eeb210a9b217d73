#!/usr/bin/env bash
# Session 12 device-check on main 4e7cd93 (vector key-stride sums, staged score_ptr, bandwg encode_pair).
scripts/device-session-check check .device/s12d/bin.tar.xz
