"""ApiVersions: advertise exactly the APIs and versions the registered handlers serve."""

from __future__ import annotations

from trio_broker.handlers.base import HANDLERS, RequestContext, handles
from trio_broker.protocol import messages as m
from trio_broker.protocol.error_codes import ErrorCode

ApiVersionsResponse = m.ApiVersionsResponse


def supported_api_versions() -> list[ApiVersionsResponse.ApiVersion]:
    return [
        ApiVersionsResponse.ApiVersion(
            api_key=spec.api_key, min_version=spec.advertised_min, max_version=spec.max_version
        )
        for spec in sorted(HANDLERS.values(), key=lambda s: s.api_key)
    ]


@handles(m.ApiKey.API_VERSIONS)
async def handle_api_versions(
    ctx: RequestContext, request: m.ApiVersionsRequest | None
) -> m.ApiVersionsResponse:
    # request is None when the client asked for a version we do not know: the
    # connection encodes this answer as v0 with UNSUPPORTED_VERSION (KAFKA-FACTS.md).
    error = ErrorCode.UNSUPPORTED_VERSION if request is None else ErrorCode.NONE
    return ApiVersionsResponse(
        error_code=error,
        api_keys=supported_api_versions(),
        throttle_time_ms=0,
    )
