#!/usr/bin/env bash
# Mutation testing with mutmut 3 over the pure state machines (and the producer registry
# beside them), the codec primitives, the record-batch validation (handlers/produce.py: only
# validate_batch has fast tests) and the pure rule modules of replication, the epoch cache,
# transactions and the ZooKeeper layout.
#
#   tools/mutation.sh                       # every module below, one after the other
#   tools/mutation.sh state/mute            # only the modules whose path contains "state/mute"
#   RECHECK=0 JOBS=2 tools/mutation.sh       # skip the slow recheck of survivors; 2 workers
#   MUTANTS='*_mute_event* *_write_loop*' tools/mutation.sh server/connection  # only these (mutmut globs)
#   TESTS='tests/integration/test_mute_wiring.py' tools/mutation.sh server/connection  # other tests
#   MUTATION_EXAMPLES=60 HYPOTHESIS_SEED=1 tools/mutation.sh models/trio_broker/replication/truncation
#                                           # a "models/" listing: the machines alone, no unit test
#
# The connection (server/connection.py) is socket-level: seconds per mutant, so pick its
# mute wiring with MUTANTS (docs/verification.md names the ones used).
# mutmut reads its settings from setup.cfg, which this project does not have, so for each
# module the script copies the working tree (tracked and untracked, not ignored files) to a
# scratch directory, writes the settings there and runs mutmut in the copy: the working
# tree is never touched. Each module is run against the fast tests that exercise it; mutmut
# runs, for each mutant, only those of them whose coverage reaches the mutated function.
# mutmut is a dev tool, installed on demand, not a project dependency.
# Output: one line per module "<module>: killed/total" and the survivors' names; inspect
# one with `cd <workdir> && mutmut show <name>`.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
BASE="${MUTATION_WORKDIR:-$(mktemp -d /tmp/trio-broker-mutation.XXXXXX)}"
FILTER="${1:-}"

# module | the tests that kill its mutants
MODULES=(
  "trio_broker/state/mute.py|tests/unit/state/test_mute.py statemachine/test_mute_machine.py"
  "trio_broker/state/response_order.py|statemachine/test_response_order_machine.py tests/unit/state/test_mute.py"
  "trio_broker/protocol/primitives.py|tests/unit/protocol/test_primitives.py tests/unit/protocol/test_framing.py tests/unit/protocol/test_headers.py tests/unit/protocol/test_codec_golden.py fuzz/test_fuzz_records.py"
  "trio_broker/state/producer.py|tests/unit/state/test_producer_state.py tests/unit/state/test_producer_state_registry.py statemachine/test_producer_machine.py"
  "trio_broker/services/producers.py|tests/unit/state/test_producer_state.py tests/unit/state/test_producer_state_registry.py"
  "trio_broker/state/group.py|tests/unit/groups/test_group_state.py tests/unit/state/test_group_state_edges.py statemachine/test_group_machine.py"
  "trio_broker/state/quota.py|tests/unit/state/test_quota.py"
  "trio_broker/handlers/produce.py|tests/unit/protocol/test_records_validation.py"
  "trio_broker/replication/leader.py|tests/unit/replication/test_replication_rules.py tests/unit/replication/test_replication_rule_properties.py"
  "trio_broker/replication/fetcher_rules.py|tests/unit/replication/test_fetcher_rules.py"
  "trio_broker/replication/follower.py|tests/unit/replication/test_replication_rule_properties.py tests/unit/replication/test_replication_rules.py"
  "trio_broker/replication/truncation.py|tests/unit/replication/test_replication_rules.py"
  "trio_broker/replication/controller_rules.py|tests/unit/replication/test_controller_rules.py tests/unit/replication/test_reassignment_rules.py tests/unit/replication/test_requested_election.py"
  "trio_broker/replication/throttle.py|tests/unit/cluster/test_throttled_replicas.py tests/unit/replication/test_byte_budget.py"
  "trio_broker/storage/epoch_cache.py|tests/unit/replication/test_replication_rules.py tests/unit/storage/test_follower_storage.py"
  "trio_broker/state/partition_txns.py|tests/unit/state/test_partition_txns.py statemachine/test_partition_txn_machine.py"
  "trio_broker/transactions/state.py|tests/unit/transactions/test_txn_state_rules.py tests/unit/transactions/test_txn_coordinator.py statemachine/test_txn_coordinator_machine.py"
  "trio_broker/transactions/log_format.py|tests/unit/transactions/test_txn_coordinator.py"
  "trio_broker/server/connection.py|tests/integration/test_in_flight_cap.py tests/integration/test_mute_wiring.py tests/integration/test_quotas.py statemachine/test_sasl_connection_machine.py statemachine/test_throttle_machine.py statemachine/test_response_order_machine.py"
  "trio_broker/cluster/zk_layout.py|tests/unit/cluster/test_zk_layout.py tests/unit/cluster/test_zk_layout_security.py tests/unit/replication/test_reassignment_rules.py"
  # The log's reads and retention against the models alone (issue 31, the nineteenth round):
  # the machines whose runs execute most of their lines, no unit test.
  "trio_broker/storage/log_reads.py|statemachine/test_storage_machine.py statemachine/test_partition_txn_machine.py"
  "trio_broker/storage/log_retention.py|statemachine/test_storage_machine.py statemachine/test_partition_txn_machine.py statemachine/test_cleaner_machine.py"
  # The replication rules against the models alone (issue 31, the twentieth round): the
  # replication machine runs the follower's, the fetcher's, the truncation's and the
  # leader's rules; the reassignment machine the leader's and two of replica_rules.py's
  # (the filter "models/" picks these; the first four above list the unit tests).
  "models/trio_broker/replication/follower.py|statemachine/test_replication_machine.py"
  "models/trio_broker/replication/truncation.py|statemachine/test_replication_machine.py"
  "models/trio_broker/replication/fetcher_rules.py|statemachine/test_replication_machine.py"
  "models/trio_broker/replication/leader.py|statemachine/test_replication_machine.py statemachine/test_reassignment_machine.py"
  "models/trio_broker/replication/replica_rules.py|statemachine/test_reassignment_machine.py"
)

"$PY" -c "import mutmut" 2>/dev/null || "$PY" -m pip install -q mutmut
# Machines that honour it (statemachine/test_group_machine.py) run fewer examples per mutant.
export MUTATION_EXAMPLES="${MUTATION_EXAMPLES:-60}"
# conftest.py's profile without shrinking: the first failure kills a mutant.
export HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-mutation}"
export PATH="$(dirname "$PY"):$PATH"

for entry in "${MODULES[@]}"; do
  label="${entry%%|*}"
  module="${label#models/}"
  tests="${TESTS:-${entry#*|}}"
  # A "models/" listing runs only when asked for by name (tools/mutation.sh models/...).
  [[ "$label" == models/* && "$FILTER" != models/* ]] && continue
  [[ -n "$FILTER" && "$label" != *"$FILTER"* ]] && continue
  work="$BASE/$(basename "$module" .py)"
  [[ "$label" == models/* ]] && work="$BASE/models-$(basename "$module" .py)"
  rm -rf "$work" && mkdir -p "$work"
  # bench/ is left out: benchmarks write scratch files there while we copy.
  (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard -- . ':!bench' \
    | tar -c --null -T - -f - | tar -x -C "$work" -f -) || echo "warning: copy incomplete" >&2
  {
    echo "[mutmut]"
    echo "source_paths=trio_broker"
    echo "only_mutate=$module"
    echo "tests_dir="; for t in $tests; do echo "    $t"; done
    echo "also_copy="; for d in spec statemachine fuzz tests tools docs conftest.py; do echo "    $d"; done
    echo "pytest_add_cli_args=-p no:randomly -q -p no:cacheprovider"
  } > "$work/setup.cfg"
  (
    cd "$work"
    set -f  # MUTANTS holds globs for mutmut, not for the shell
    "$PY" -m mutmut run --max-children "${JOBS:-2}" ${MUTANTS:-} > run.log 2>&1 || true
    set +f
    "$PY" -m mutmut results --all true > results.txt 2>&1 || true
    "$PY" - "$module" "$tests" <<'PY'
import collections, os, pathlib, re, sys
lines = pathlib.Path("results.txt").read_text().splitlines()
status = {}
for line in lines:
    m = re.match(r"\s*(\S+):\s*(.+?)\s*$", line)
    if m and "__mutmut_" in m.group(1):
        status[m.group(1)] = m.group(2)
counts = collections.Counter(status.values())
killed = counts["killed"] + counts["timeout"]
checked = sum(n for s, n in counts.items() if s != "not checked")
print(f"{sys.argv[1]}: {killed}/{checked} killed ({dict(counts)})")
# Per function (mutant names are <module>.x_<function>__mutmut_<n>, methods xǁClassǁname):
# a module whose shell has no fast tests can still be judged function by function.
per_function = collections.defaultdict(collections.Counter)
for name, state in status.items():
    function = name.rsplit("__mutmut_", 1)[0].rsplit(".", 1)[-1].removeprefix("x_")
    per_function[function.replace("xǁ", "").replace("ǁ", ".")][state] += 1
for function, states in sorted(per_function.items()):
    done = states["killed"] + states["timeout"]
    print(f"  {function}: {done}/{sum(states.values())} ({dict(states)})")
survivors = sorted(n for n, s in status.items() if s == "survived")
if os.environ.get("RECHECK", "1") == "0":
    survivors_unchecked, survivors = survivors, []
# mutmut 3 switches mutants on at call time inside a process that imported the module
# already, so a mutant in code that runs at import (tables built by helper functions)
# is never live. Recheck each survivor the slow way: write it into the copy's source,
# run the module's tests in a fresh process, restore.
import subprocess
source = pathlib.Path(sys.argv[1])
original = source.read_bytes()
still = []
for name in survivors:
    try:
        subprocess.run([sys.executable, "-m", "mutmut", "apply", name], check=True,
                       capture_output=True)
        run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:randomly",
                              *sys.argv[2].split()], capture_output=True, timeout=600)
        killed_now = run.returncode != 0
    except subprocess.TimeoutExpired:
        killed_now = True
    finally:
        source.write_bytes(original)
    if killed_now:
        killed += 1
    else:
        still.append(name)
print(f"{sys.argv[1]}: {killed}/{checked} killed after rechecking {len(survivors)} survivors"
      f" in fresh processes ({dict(counts)} before)")
if os.environ.get("RECHECK", "1") == "0":
    still = survivors_unchecked
for name in still:
    print(f"  survived: {name}")
PY
  )
  echo "  workdir: $work"
done
