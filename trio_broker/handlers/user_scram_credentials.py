"""DescribeUserScramCredentials (50) and AlterUserScramCredentials (51), KIP-554.

They read and change the broker's SCRAM credential store (the file that
``trio-broker users`` manages). Describe needs DESCRIBE on the cluster, Alter
needs ALTER (Kafka's rule). Upsertions arrive already salted by the client
(salt, iterations, salted password), so no password ever reaches the broker.
Error codes as Kafka: RESOURCE_NOT_FOUND for an unknown user or credential,
DUPLICATE_RESOURCE for a user named twice, UNSUPPORTED_SASL_MECHANISM and
UNACCEPTABLE_CREDENTIAL for a bad mechanism or iteration count.
"""

from __future__ import annotations

from collections import Counter

from trio_broker.handlers.authorization import Operation, ResourceType, authorized
from trio_broker.handlers.base import RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode
from trio_broker.security.credentials import (
    MECHANISM_IDS,
    CredentialError,
    check_mechanism,
    credential_from_salted,
)

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
) -> m.AlterUserScramCredentialsResponse:
    Result = Alter.AlterUserScramCredentialsResult
    names = [d.name for d in request.deletions] + [u.name for u in request.upsertions]
    if not authorized(ctx, Operation.ALTER, ResourceType.CLUSTER):
        return Alter(throttle_time_ms=0, results=[
            Result(user=name, error_code=ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                   error_message="ALTER on the cluster refused")
            for name in dict.fromkeys(names)
        ])  # fmt: skip
    store = ctx.services.credentials
    outcome: dict[str, tuple[int, str | None]] = {}
    # Kafka: one alteration per (user, mechanism); a user altered twice for the same
    # mechanism fails as a whole.
    pairs = Counter((d.name, d.mechanism) for d in request.deletions)
    pairs.update((u.name, u.mechanism) for u in request.upsertions)
    for (name, _), count in pairs.items():
        if count > 1:
            outcome[name] = (ErrorCode.DUPLICATE_RESOURCE,
                             f"user {name} altered twice for one mechanism")  # fmt: skip
    for deletion in request.deletions:
        name = deletion.name
        if name in outcome:
            continue
        mechanism = MECHANISM_NAMES.get(deletion.mechanism)
        if mechanism is None:
            outcome[name] = (ErrorCode.UNSUPPORTED_SASL_MECHANISM, "unknown SCRAM mechanism")
        elif not store.delete(name, mechanism):
            outcome[name] = (ErrorCode.RESOURCE_NOT_FOUND,
                             f"no {mechanism} credential for user {name}")  # fmt: skip
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
            store.put(name, mechanism, credential)
        except CredentialError as exc:
            outcome[name] = (ErrorCode.UNACCEPTABLE_CREDENTIAL, str(exc))
    results = [
        Result(user=name, error_code=outcome.get(name, (ErrorCode.NONE, None))[0],
               error_message=outcome.get(name, (ErrorCode.NONE, None))[1])
        for name in dict.fromkeys(names)
    ]  # fmt: skip
    return Alter(throttle_time_ms=0, results=results)
