#!/usr/bin/env bash
# Session 11 device-check on main 5f47475 (radix-descent selection, block-sparse row bounds at
# d 128); the command as scripts/device-session-check now holds it (the call ran the same lines inline).
scripts/device-session-check check .device/s11h/bin.tar.xz
