"""A broker's membership in the cluster: its registration, the broker list, the controller.

Three tasks, each a loop over ZooKeeper's one-shot watches:

- **registration**: ``/brokers/ids/<id>``, ephemeral; made again after a session expires
  (waiting, as Kafka does, until the old session's znode is gone);
- **broker list**: the children of ``/brokers/ids``, read into :class:`ClusterView`;
- **controller election**: whoever creates the ephemeral ``/controller`` first is the
  controller, increments ``/controller_epoch`` conditionally and runs the controller's
  duties (``controller.py``); the others watch ``/controller`` and try again when it goes;
- **topics**: every broker follows the topics and partition states (``topics_watch.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import trio

from trio_broker.cluster.controller import (
    ControllerActions,
    NotController,
    Rebalance,
    run_controller,
)
from trio_broker.cluster.coordination import (
    BadVersion,
    Coordination,
    CoordinationError,
    NodeExists,
)
from trio_broker.cluster.topics_watch import follow_topics
from trio_broker.cluster.waiting import RETRY_S, wait_any
from trio_broker.cluster.zk_layout import (
    BROKER_IDS,
    CONTROLLER,
    CONTROLLER_EPOCH,
    BrokerRegistration,
    ControllerClaim,
    CoordinationDataError,
    broker_path,
    decode_controller_epoch,
    encode_controller_epoch,
)
from trio_broker.services.cluster_view import BrokerInfo, ClusterView

__all__ = ["BrokerIdInUse", "run_membership"]

log = logging.getLogger(__name__)


class BrokerIdInUse(CoordinationError):
    """Another live broker registered this broker id."""


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


async def run_membership(
    coord: Coordination,
    registration: BrokerRegistration,
    view: ClusterView,
    *,
    now_ms: Callable[[], int] = wall_clock_ms,
    unclean: bool = False,
    rebalance: Rebalance | None = None,
    on_change: Callable[[], None] = lambda: None,
    on_controller: Callable[[ControllerActions | None], None] = lambda _: None,
    stale_registration_wait_s: float = 0.0,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Register, then keep ``view`` current until cancelled.

    Reports started once registered. ``on_controller`` gets the controller's actions
    while this broker is the controller, and None when it stops being it.

    If the id is registered already, that may be this broker's previous life (killed
    with -9 a moment ago: its session lives until ZooKeeper expires it), so it waits up
    to ``stale_registration_wait_s`` for the znode to go; if it is still there then, a
    live broker holds the id (a configuration mistake): :class:`BrokerIdInUse`.
    """
    await _register(coord, registration, wait_if_taken_s=stale_registration_wait_s)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_stay_registered, coord, registration)
        # Started once the broker list and the topics were read: a broker that serves
        # from then on lists the cluster's brokers and knows its topics.
        await nursery.start(_follow_brokers, coord, view, on_change)
        nursery.start_soon(
            _elect_controller, coord, view, now_ms, unclean, rebalance, on_controller
        )
        await nursery.start(follow_topics, coord, view, on_change)
        task_status.started()


async def _register(
    coord: Coordination,
    registration: BrokerRegistration,
    *,
    wait_if_taken_s: float,
) -> None:
    """Create this broker's ephemeral registration; while another session holds it, try
    again for ``wait_if_taken_s`` (inf: until it goes), then :class:`BrokerIdInUse`."""
    path = broker_path(registration.broker_id)
    give_up_at = trio.current_time() + wait_if_taken_s
    warned = math.isinf(wait_if_taken_s)  # re-registering: no need to say so
    while True:
        try:
            await coord.create(path, registration.encode(), ephemeral=True)
            log.info("registered as broker %d", registration.broker_id)
            return
        except NodeExists:
            try:
                if await coord.owned_by_this_session(path):
                    # Our own create, whose reply was lost: registered (Kafka checks the
                    # ephemeral owner of its registration the same way).
                    log.info("registered as broker %d", registration.broker_id)
                    return
            except CoordinationError as exc:
                log.warning("registering broker %d: %s", registration.broker_id, exc)
                await trio.sleep(RETRY_S)
                continue
            if trio.current_time() >= give_up_at:
                raise BrokerIdInUse(
                    f"broker id {registration.broker_id} is registered by a live broker "
                    f"({path} exists in ZooKeeper)"
                ) from None
            if not warned:
                warned = True
                log.warning(
                    "%s exists: waiting up to %.0f s for ZooKeeper to expire the "
                    "session of a previous run of broker %d", path,
                    give_up_at - trio.current_time(), registration.broker_id,
                )  # fmt: skip
        except CoordinationError as exc:
            log.warning("registering broker %d: %s", registration.broker_id, exc)
        # After our own session expired, its znode lingers until ZooKeeper notices.
        await trio.sleep(RETRY_S)


async def _stay_registered(coord: Coordination, registration: BrokerRegistration) -> None:
    while True:
        await coord.session_lost().wait()
        log.warning(
            "ZooKeeper session expired: registering broker %d again", registration.broker_id
        )
        await _register(coord, registration, wait_if_taken_s=math.inf)


async def _follow_brokers(
    coord: Coordination,
    view: ClusterView,
    on_change: Callable[[], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    first = True
    while True:
        lost = coord.session_lost()
        try:
            names, changed = await coord.children_and_watch(BROKER_IDS)
            brokers = {}
            for name in names:
                if not name.isdigit():
                    continue
                znode = await coord.get(f"{BROKER_IDS}/{name}")
                if znode is None:
                    continue  # gone since we listed it; the watch will tell
                try:
                    reg = BrokerRegistration.decode(int(name), znode.data)
                except CoordinationDataError as exc:
                    log.warning("ignoring %s/%s: %s", BROKER_IDS, name, exc)
                    continue
                brokers[reg.broker_id] = BrokerInfo(
                    reg.broker_id,
                    reg.host,
                    reg.port,
                    reg.rack,
                    reg.listener_addresses(),
                    registered_zxid=znode.created,
                )
        except CoordinationError as exc:
            log.warning("reading the broker list: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        view.brokers = brokers
        if view.broker_id in brokers:
            view.last_listing_self = brokers  # what clients are told while it is not
        on_change()
        if first:
            first = False
            task_status.started()
        await wait_any(changed, lost)


async def _elect_controller(
    coord: Coordination,
    view: ClusterView,
    now_ms: Callable[[], int],
    unclean: bool,
    rebalance: Rebalance | None,
    on_controller: Callable[[ControllerActions | None], None],
) -> None:
    me = view.broker_id
    while True:
        lost = coord.session_lost()
        try:
            try:
                claim = ControllerClaim(me, now_ms()).encode()
                await coord.create(CONTROLLER, claim, ephemeral=True)
            except NodeExists:
                pass
            else:
                view.controller_epoch = await _next_controller_epoch(coord)
                log.info("broker %d is the controller, epoch %d", me, view.controller_epoch)
            znode, changed = await coord.get_and_watch(CONTROLLER)
            if znode is None:
                continue  # the controller just went: try to take over at once
            try:
                view.controller_id = ControllerClaim.decode(znode.data).broker_id
            except CoordinationDataError as exc:
                log.warning("ignoring %s: %s", CONTROLLER, exc)
                view.controller_id = -1
            # The new controller bumps the epoch just after it wins: watch that too.
            epoch, _ = await coord.get_and_watch(CONTROLLER_EPOCH, into=changed)
            if epoch is not None:
                view.controller_epoch = decode_controller_epoch(epoch.data)
        except (CoordinationError, CoordinationDataError) as exc:
            log.warning("controller election: %s", exc)
            await trio.sleep(RETRY_S)
            continue
        if view.controller_id == me:
            # The controller's duties last until its claim or the epoch changes hands.
            async with trio.open_nursery() as nursery:
                nursery.start_soon(
                    _controller_duties, coord, view, unclean, rebalance, on_controller,
                    nursery.cancel_scope,
                )  # fmt: skip
                await wait_any(changed, lost)
                nursery.cancel_scope.cancel()
        else:
            await wait_any(changed, lost)
        if lost.is_set() and view.controller_id == me:
            view.controller_id = -1  # our claim died with the session


async def _controller_duties(
    coord: Coordination,
    view: ClusterView,
    unclean: bool,
    rebalance: Rebalance | None,
    on_controller: Callable[[ControllerActions | None], None],
    done: trio.CancelScope,
) -> None:
    try:
        await run_controller(
            coord, view, unclean=unclean, rebalance=rebalance, on_active=on_controller
        )
    except NotController as exc:
        log.warning("broker %d: %s", view.broker_id, exc)
    except CoordinationError as exc:
        # The first read of /controller_epoch failed (a dropped connection): the
        # election reads again and, still the controller, starts these duties anew.
        # Raised on, it would end the membership and with it the broker.
        log.warning("broker %d: starting the controller's duties: %s", view.broker_id, exc)
        await trio.sleep(RETRY_S)
    done.cancel()


async def _next_controller_epoch(coord: Coordination) -> int:
    """Increment ``/controller_epoch`` with a conditional write; return the new epoch."""
    while True:
        znode = await coord.get(CONTROLLER_EPOCH)
        try:
            if znode is None:
                await coord.create(CONTROLLER_EPOCH, encode_controller_epoch(1))
                return 1
            epoch = decode_controller_epoch(znode.data) + 1
            await coord.set(CONTROLLER_EPOCH, encode_controller_epoch(epoch), znode.version)
            return epoch
        except (NodeExists, BadVersion):
            continue  # another controller-to-be got there first: read again
