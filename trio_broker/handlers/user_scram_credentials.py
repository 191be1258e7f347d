"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554.

They read and change the broker's SCRAM credential store (the file that
``trio-broker users`` manages); in a cluster, Alter writes to ZooKeeper and Describe
reads this broker's copy of it (cluster/security_store.py). Describe needs DESCRIBE on the cluster, Alter
needs ALTER (Kafka's rule). Upsertions arrive already salted by the client
(salt, iterations, salted password), so no password ever reaches the broker.
Error codes as Kafka: RESOURCE_NOT_FOUND for an unknown user or credential,
DUPLICATE_RESOURCE for a user named twice, UNSUPPORTED_SASL_MECHANISM and
UNACCEPTABLE_CREDENTIAL for a bad mechanism or iteration count.
"""

from __future__ import annotations

from collections import Counter

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import Deferred, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import (
    MECHANISM_IDS,
    CredentialError,
    ScramCredential,
    check_mechanism,
    credential_from_salted,
)
from trio_broker.security.shared_store import SharedStoreError

Describe = m.DescribeUserScramCredentialsResponse
Alter = m.AlterUserScramCredentialsResponse
MECHANISM_NAMES = {number: name for name, number in MECHANISM_IDS.items()}


def _info(
    mechanism: str, iterations: int
) -> Describe.DescribeUserScramCredentialsResult.CredentialInfo:
    return Describe.DescribeUserScramCredentialsResult.CredentialInfo(
        mechanism=MECHANISM_IDS[mechanism], iterations=iterations
    )


@handles(m.ApiKey.DESCRIBE_USER_SCRAM_CREDENTIALS)
async def handle_describe(
    ctx: RequestContext, request: m.DescribeUserScramCredentialsRequest
) -> m.DescribeUserScramCredentialsResponse:
    Result = Describe.DescribeUserScramCredentialsResult
    if not authorized(ctx, Operation.DESCRIBE, ResourceType.CLUSTER):
        return Describe(throttle_time_ms=0, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                        error_message="DESCRIBE on the cluster refused", results=[])  # fmt: skip
    users = ctx.services.credentials.users()
    wanted = sorted(users) if not request.users else [u.name for u in request.users]
    counts = Counter(wanted)
    results: list[Describe.DescribeUserScramCredentialsResult] = []
    for name in dict.fromkeys(wanted):
        if counts[name] > 1:
            results.append(Result(user=name, error_code=ErrorCode.DUPLICATE_RESOURCE,
                                  error_message=f"user {name} named twice", credential_infos=[]))  # fmt: skip
        elif name not in users:
            results.append(Result(user=name, error_code=ErrorCode.RESOURCE_NOT_FOUND,
                                  error_message=f"no credentials for user {name}",
                                  credential_infos=[]))  # fmt: skip
        else:
            infos = [_info(mech, c.iterations) for mech, c in sorted(users[name].items())]
            results.append(Result(user=name, error_code=ErrorCode.NONE, error_message=None,
                                  credential_infos=infos))  # fmt: skip
    return Describe(throttle_time_ms=0, error_code=ErrorCode.NONE, error_message=None,
                    results=results)  # fmt: skip


@handles(m.ApiKey.ALTER_USER_SCRAM_CREDENTIALS)
async def handle_alter(
    ctx: RequestContext, request: m.AlterUserScramCredentialsRequest
) -> m.AlterUserScramCredentialsResponse | Deferred:
    Result = Alter.AlterUserScramCredentialsResult
    names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    if not authorized(ctx, Operation.ALTER, ResourceType.CLUSTER):
        return Alter(throttle_time_ms=0, results=[
            Result(user=name, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                   error_message="ALTER on the cluster refused")
            for name in dict.fromkeys(names)
        ])  # fmt: skip
    outcome: dict[str, tuple[int, str | None]] = {}
    # Kafka: one alteration per (user, mechanism); a user altered twice for the same
    # mechanism fails as a whole.
    pairs = Counter((d.name, d.mechanism) for d in request.deletions)
    pairs.update((u.name, u.mechanism) for u in request.upsertions)
    for (name, _), count in pairs.items():
        if count > 1:
            outcome[name] = (ErrorCode.DUPLICATE_RESOURCE,
                             f"user {name} altered twice for one mechanism")  # fmt: skip
    # What passes the checks: (user, mechanism, credential), None to delete.
    changes: list[tuple[str, str, ScramCredential | None]] = []
    for deletion in request.deletions:
        name = deletion.name
        if name in outcome:
            continue
        mechanism = MECHANISM_NAMES.get(deletion.mechanism)
        if mechanism is None:
            outcome[name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
        else:
            changes.append((name, mechanism, None))
    for upsertion in request.upsertions:
        name = upsertion.name
        if name in outcome:
            continue
        mechanism = MECHANISM_NAMES.get(upsertion.mechanism)
        if mechanism is None:
            outcome[name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
            continue
        try:
            check_mechanism(mechanism, upsertion.iterations)
            if not name or not upsertion.salt or not upsertion.salted_password:
                raise CredentialError("empty user name, salt or salted password")
            credential = credential_from_salted(
                mechanism, bytes(upsertion.salt), bytes(upsertion.salted_password),
                upsertion.iterations,
            )  # fmt: skip
        except CredentialError as exc:
            outcome[name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
            continue
        changes.append((name, mechanism, credential))
    shared = ctx.services.shared_security
    if shared is not None:

        async def store_shared() -> m.AlterUserScramCredentialsResponse:
            # In a cluster: into ZooKeeper, where every broker's copy follows.
            for name, mechanism, new in changes:
                if name in outcome:  # an earlier change of the user failed
                    continue
                try:
                    if new is not None:
                        await shared.put_credential(name, mechanism, new)
                    elif not await shared.delete_credential(name, mechanism):
                        outcome[name] = _not_found(name, mechanism)
                except SharedStoreError as exc:
                    outcome[name] = (ErrorCode.UNKNOWN_SERVER_ERROR,
                                     f"cannot store credentials: {exc}")  # fmt: skip
            return _answer(names, outcome)

        return Deferred(store_shared)
    store = ctx.services.credentials
    for name, mechanism, new in changes:
        if name in outcome:  # an earlier change of the user failed
            continue
        try:
            if new is not None:
                store.put(name, mechanism, new)
            elif not store.delete(name, mechanism):
                outcome[name] = _not_found(name, mechanism)
        except CredentialError as exc:
            outcome[name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
    return _answer(names, outcome)


def _not_found(name: str, mechanism: str) -> tuple[int, str | None]:
    return ErrorCode.RESOURCE_NOT_FOUND, f"no {mechanism} credential for user {name}"


def _answer(
    names: list[str], outcome: dict[str, tuple[int, str | None]]
) -> m.AlterUserScramCredentialsResponse:
    Result = Alter.AlterUserScramCredentialsResult
    results = [
        Result(user=name, error_code=outcome.get(name, (ErrorCode.NONE, None))[0],
               error_message=outcome.get(name, (ErrorCode.NONE, None))[1])
        for name in dict.fromkeys(names)
    ]  # fmt: skip
    return Alter(throttle_time_ms=0, results=results)
