#!/usr/bin/env bash
# Regenerate every shipped recording (byte-identical to the committed files). Run from the repo root.
# Level 6: the shipped files favour size; the simulator's default (1) favours speed.
set -euo pipefail
FH="${FH:-.venv/bin/fleethealth}"
D=replay_data
$FH simulate --quiet --gzip-level 6 --hosts 64 --duration 4h --interval 60 --seed 1 --fault-rate 2000 --min-per-mode 2 --out $D/smoke-64h.jsonl.gz
$FH simulate --quiet --gzip-level 6 --hosts 128 --duration 1d --interval 600 --seed 2 --fault-rate 100 --out $D/fleet-128h-1d.jsonl.gz
$FH simulate --quiet --gzip-level 6 --hosts 16 --duration 6h --interval 60 --seed 3 --scenario flapping-cable --out $D/flapping-cable-16h.jsonl.gz
$FH simulate --quiet --gzip-level 6 --hosts 16 --duration 6h --interval 60 --seed 4 --scenario sbe-storm-no-uce --out $D/sbe-storm-no-uce-16h.jsonl.gz
$FH simulate --quiet --gzip-level 6 --hosts 32 --duration 2h --interval 60 --seed 5 --fault-rate 0 --scenario driver-update --out $D/driver-update-32h.jsonl.gz
$FH simulate --quiet --gzip-level 6 --hosts 24 --duration 12h --interval 120 --seed 6 --scenario hard-cases --out $D/hard-cases-24h.jsonl.gz
