#!/usr/bin/env bash
# Session 10 device-check on main a6ff98b (v24 bcstore + v26); the command as
# scripts/device-session-check now holds it (the call ran the same lines inline).
scripts/device-session-check check .device/s10g/bin.tar.xz
