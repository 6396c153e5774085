"""The protocol, model-checked: several drivers in any interleaving, crashes anywhere.

Hypothesis' stateful testing (``RuleBasedStateMachine``) drives the real coordinator code
(``Coordinator.run_epoch``: recovery, claim, pre-commit, decision, commit, clean-up) over
in-memory participants (:mod:`tests.memsink`): one shared log store, two sinks' targets and
Spark's commit log. Each driver is a thread that stops at every step the participants
tick (every log record created or deleted, every prepare, commit and abort), and goes on
only when the machine lets it: the machine chooses which driver takes the next steps,
starts new drivers (up to three at once: a restarted query next to zombies of it), and
kills any of them between two steps (SIGKILL: every later step of it raises).

After every step the invariants hold:

* at most one round of an epoch is decided;
* no transaction a decision names is ever aborted;
* a target shows only transactions a decision names;
* no driver ends with an error other than losing a race (:class:`FencedError`) or being
  behind an epoch another driver committed (:class:`CheckpointMismatchError`: a zombie).

At the end every driver still running is killed and a new one runs the query alone to its
end, with one more epoch of new input (its first epoch runs recovery): then every target
holds each row exactly once, nothing stays prepared and every epoch is committed in the
log. ``test_the_model_catches_a_broken_protocol`` seeds
mutations into the coordinator (no recovery, no void, a round claimed twice) and expects
the model to find a counterexample for each.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from typing_extensions import override

from tests.memsink import Crash, Crasher, MemHandle, MemSink, MemStore, MemTarget, batches_for
from tests.memsink import memory_precommit as precommit_in_process
from txsink import Coordinator
from txsink.errors import CheckpointMismatchError, FencedError
from txsink.protocol.log import TxLog

EPOCHS = 3
PARTITIONS = 2
ROWS = 2
APP = "model"
UIDS = ("a", "b")
MAX_DRIVERS = 3
#: The steps a driver may take alone at the end before it counts as stuck.
FINAL_STEPS = 5000


class Driver(Crasher):
    """One driver process: a thread that parks at every tick until :meth:`step`."""

    def __init__(self, world: World, name: str, attempt_base: int, epochs: int = EPOCHS) -> None:
        super().__init__()
        self.world = world
        self.name = name
        self.attempt_base = attempt_base
        self.epochs = epochs
        self.ended = False
        self.finished = False
        self.fenced = False
        self.error: BaseException | None = None
        self._go = threading.Semaphore(0)
        self._parked = threading.Semaphore(0)
        self._kill = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._parked.acquire()  # parked before its first step

    # -- in the driver's thread -------------------------------------------------------

    @override
    def tick(self, label: str) -> None:
        if self.dead:
            raise Crash(f"already dead ({label})")
        self.trace.append(label)
        self._parked.release()
        self._go.acquire()
        if self._kill:
            self.dead = True
            raise Crash(label)

    def _main(self) -> None:
        _current.driver = self
        try:
            self.tick("start")
            coordinator = self.world.coordinator(self)
            for epoch in range(self.epochs):
                if epoch in self.world.spark_done:
                    continue
                batches = batches_for(epoch, PARTITIONS, ROWS)
                job = precommit_in_process(batches, attempt_base=self.attempt_base)
                coordinator.run_epoch(epoch, job, app_id=APP)
                self.tick(f"spark commit log {epoch}")
                self.world.spark_done.add(epoch)
            self.finished = True
        except Crash:
            self.dead = True
        except (FencedError, CheckpointMismatchError):
            # Lost a race to another driver, or asked for an epoch older than one another
            # driver committed (a zombie behind the checkpoint): its query fails, loudly.
            self.fenced = True
        except BaseException as err:  # any other end is the finding
            self.error = err
        finally:
            self.ended = True
            self._parked.release()

    # -- in the machine's thread ------------------------------------------------------

    def step(self) -> None:
        """Let the driver take its next step; returns once it parked again or ended."""
        if not self.ended:
            self._go.release()
            self._parked.acquire()

    def kill(self) -> None:
        """SIGKILL between two steps: the next step raises, and so would every later one."""
        self._kill = True
        self.step()
        self._thread.join(10)


class _Current(threading.local):
    driver: Driver | None = None


_current = _Current()


class ThreadStore(MemStore):
    """The shared log store; each record ticks the driver whose thread writes it."""

    @property
    def crasher(self) -> Crasher:
        driver = _current.driver
        assert driver is not None, "the log written outside a driver's thread"
        return driver

    @crasher.setter
    def crasher(self, value: Crasher) -> None:
        pass  # MemStore.__init__ sets one: each thread's driver is the crasher here


class ModelSink(MemSink):
    """A memory sink that records every prepared transaction it aborts."""

    def __init__(self, uid: str, target: MemTarget, crasher: Crasher, aborted: set[str]) -> None:
        super().__init__(uid, target, crasher)
        self.aborted = aborted

    @override
    def abort(self, handle: MemHandle) -> None:
        name = str(handle.txn)
        was_prepared = name in self.target.prepared
        super().abort(handle)
        if was_prepared:
            self.aborted.add(name)


class World:
    """What survives every driver: the log, the targets, Spark's commit log."""

    def __init__(self) -> None:
        self.store = ThreadStore()
        self.targets = {uid: MemTarget() for uid in UIDS}
        self.aborted: dict[str, set[str]] = {uid: set() for uid in UIDS}
        self.spark_done: set[int] = set()

    def coordinator(self, driver: Driver) -> Coordinator:
        sinks = [ModelSink(uid, self.targets[uid], driver, self.aborted[uid]) for uid in UIDS]
        return Coordinator(sinks, log=TxLog(self.store), app_id=APP, faults=None)

    def decisions(self, epoch: int) -> list[Any]:
        log = TxLog(self.store)
        prefix = f"epochs/{epoch:020d}/decision-"
        found = [log._read_decision(key) for key in self.store.list(prefix)]
        return [d for d in found if d is not None]


class ProtocolModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()
        self.drivers: list[Driver] = []
        self.started = 0

    def _live(self) -> list[Driver]:
        return [d for d in self.drivers if not d.ended]

    @precondition(lambda self: len(self._live()) < MAX_DRIVERS)
    @rule()
    def start_driver(self) -> None:
        """A driver starts the query (a restart after a crash, or a zombie's twin)."""
        self.started += 1
        name = f"driver-{self.started}"
        self.drivers.append(Driver(self.world, name, attempt_base=100 * self.started))

    @precondition(lambda self: bool(self._live()))
    @rule(which=st.integers(0, MAX_DRIVERS - 1), steps=st.integers(1, 6))
    def step(self, which: int, steps: int) -> None:
        live = self._live()
        driver = live[which % len(live)]
        for _ in range(steps):
            driver.step()

    @precondition(lambda self: bool(self._live()))
    @rule(which=st.integers(0, MAX_DRIVERS - 1))
    def kill(self, which: int) -> None:
        live = self._live()
        live[which % len(live)].kill()

    @invariant()
    def at_most_one_decided_round_per_epoch(self) -> None:
        for epoch in range(EPOCHS):
            rounds = [d.round for d in self.world.decisions(epoch)]
            assert len(rounds) <= 1, f"epoch {epoch} decided in rounds {rounds}"

    @invariant()
    def no_decided_transaction_is_aborted(self) -> None:
        for epoch in range(EPOCHS):
            for decision in self.world.decisions(epoch):
                for uid, aborted in self.world.aborted.items():
                    lost = decision.txn_names() & aborted
                    assert not lost, f"{uid}: decided transactions aborted: {sorted(lost)}"

    @invariant()
    def targets_show_only_decided_transactions(self) -> None:
        decided = {
            name for e in range(EPOCHS) for d in self.world.decisions(e) for name in d.txn_names()
        }
        for uid, target in self.world.targets.items():
            shown = set(target.committed) - decided
            assert not shown, f"{uid}: committed without a decision: {sorted(shown)}"

    @invariant()
    def no_driver_failed(self) -> None:
        for driver in self.drivers:
            assert driver.error is None, f"{driver.name} failed: {driver.error!r} {driver.trace}"

    def teardown(self) -> None:
        for driver in self._live():
            driver.kill()
        # The query goes on alone, with one more epoch of new input: its first epoch runs
        # recovery (a query with nothing left to run would never call it).
        last = Driver(self.world, "final", 100 * (self.started + 1), epochs=EPOCHS + 1)
        for _ in range(FINAL_STEPS):
            if last.ended:
                break
            last.step()
        assert last.finished, (
            f"the last driver, alone, did not finish: error {last.error!r}, "
            f"fenced {last.fenced}, at {last.trace[-3:]}"
        )
        self.no_driver_failed()
        expected = sorted(
            i
            for e in range(EPOCHS + 1)
            for batches in batches_for(e, PARTITIONS, ROWS)
            for b in batches
            for i in b.column("id").to_pylist()
        )
        for uid, target in self.world.targets.items():
            assert sorted(target.visible()) == expected, f"{uid}: not exactly once"
            assert target.prepared == {}, f"{uid}: still prepared: {sorted(target.prepared)}"
        log = TxLog(self.world.store)
        assert log.pending() == [], log.pending()
        assert all(log.committed(e) is not None for e in range(EPOCHS + 1))


#: Bounded for the default suite (about 2 s); ``--run-slow`` adds a 40x longer search.
BOUNDED = settings(
    max_examples=80,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)

TestProtocolModel = ProtocolModel.TestCase
TestProtocolModel.settings = BOUNDED


@pytest.mark.slow
def test_the_protocol_model_long() -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        ProtocolModel, settings=settings(BOUNDED, max_examples=2000, stateful_step_count=80)
    )


def _no_recovery(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Coordinator, "_recover_if_needed", lambda self, *a, **k: False)


def _no_void(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(TxLog, "void", lambda self, epoch, round_, reason: None)


def _round_claimed_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    def claim_round(self: TxLog, epoch: int) -> int:
        return max(self._rounds(epoch), default=0)  # the newest round, not a new one

    monkeypatch.setattr(TxLog, "claim_round", claim_round)


MUTATIONS: list[Callable[[pytest.MonkeyPatch], None]] = [
    _no_recovery,
    _no_void,
    _round_claimed_twice,
]


@pytest.mark.parametrize("mutation", MUTATIONS, ids=lambda m: m.__name__.strip("_"))
def test_the_model_catches_a_broken_protocol(
    monkeypatch: pytest.MonkeyPatch, mutation: Callable[[pytest.MonkeyPatch], None]
) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    mutation(monkeypatch)
    hunt = settings(
        BOUNDED,
        max_examples=400,
        phases=[Phase.generate],  # the counterexample, not its shortest form
        print_blob=False,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(ProtocolModel, settings=hunt)
