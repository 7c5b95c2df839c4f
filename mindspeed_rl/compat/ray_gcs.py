"""Whether a Ray GCS answers at an address, asked over Ray's own gRPC channel (its TLS and token settings apply).

Ray has no public call for it: this uses ``ray._private.gcs_utils.create_gcs_channel`` and the generated GCS stubs
(present from Ray 2.x through 2.60, the release the stacks pin). A Ray laid out otherwise answers None here, and the
caller's TCP connection is then the whole check.
"""

from __future__ import annotations

from typing import Optional


def gcs_silence(address: str, seconds: float, waited: str) -> Optional[str]:
    """None when the Ray GCS at ``address`` tells its cluster id within ``seconds`` (over Ray's own channel: its
    TLS and token settings), else why not (``waited`` when out of time)."""
    try:
        import grpc
        from ray._private.gcs_utils import create_gcs_channel
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray laid out otherwise: the TCP connection was the check
        return None
    channel = create_gcs_channel(address)
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=seconds)
        return None
    except grpc.RpcError as exc:
        code = exc.code()
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return waited
        if code == grpc.StatusCode.UNAVAILABLE:
            return "unavailable"
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            return None  # a GCS that wants Ray's token: ray.init says so
        return f"something answers, but not as a Ray GCS: {code.name}"
    finally:
        channel.close()
