"""`dra-gpu webhook`: the validating admission webhook for opaque `gpu.nvidia.com` configs."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

from dra_gpu.cli.feature_gates import no_effect_notes, parse_feature_gates, refused_sharing_strategies
from dra_gpu.webhook.server import REQUEST_TIMEOUT_S, VALIDATE_PATH, WORKERS, TlsFiles, WebhookServer


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "webhook",
        help="run the validating admission webhook",
        description=f"Validate opaque gpu.nvidia.com configs in ResourceClaims, ResourceClaimTemplates and "
        f"DeviceClasses (HTTPS, POST {VALIDATE_PATH}, GET /healthz).",
    )
    parser.add_argument("--tls-cert-file", required=True, help="PEM certificate (chain) to serve")
    parser.add_argument("--tls-private-key-file", required=True, help="PEM private key of the certificate")
    parser.add_argument("--port", type=int, default=8443, help="HTTPS port (default 8443)")
    parser.add_argument("--bind-address", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=WORKERS,
        help=f"connections served at once, one thread each (default {WORKERS}); more wait in a bounded queue",
    )
    parser.add_argument(
        "--request-timeout",
        type=_positive_float,
        default=REQUEST_TIMEOUT_S,
        metavar="SECONDS",
        help=f"a TLS handshake or request not done within this is cut off (default {REQUEST_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--feature-gates",
        default=os.environ.get("FEATURE_GATES", ""),
        help="NVIDIA's driver feature gates, NAME=true|false,... as the kubelet plugin takes them: a claim "
        "whose config asks for a sharing strategy whose gate is off (TimeSlicingSettings=false, "
        "MPSSupport=false) is refused at admission with the plugin's message [FEATURE_GATES]",
    )
    parser.set_defaults(func=run)


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def run(args: argparse.Namespace) -> int:
    try:
        refused = refused_sharing_strategies(parse_feature_gates(args.feature_gates))
    except ValueError as err:
        print(f"dra-gpu webhook: {err}", file=sys.stderr)
        return 1
    tls = TlsFiles(args.tls_cert_file, args.tls_private_key_file)
    try:
        server = WebhookServer(
            args.bind_address,
            args.port,
            tls,
            workers=args.workers,
            request_timeout_s=args.request_timeout,
            refused_strategies=refused,
        )
    except (OSError, ValueError) as err:
        print(f"dra-gpu webhook: cannot start: {err}", file=sys.stderr)
        return 1

    def stop(signum: int, _frame: FrameType | None) -> None:
        # shutdown() waits for serve_forever() to return, so it must run outside the serving thread.
        threading.Thread(target=server.shutdown, name="shutdown", daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"dra-gpu webhook: serving https://{args.bind_address}:{server.port}{VALIDATE_PATH}", flush=True)
    for strategy, why in refused.items():
        print(f"dra-gpu webhook: refusing configs with sharing strategy {strategy}: {why}", flush=True)
    for note in no_effect_notes(args.feature_gates):
        print(f"dra-gpu webhook: {note}", flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
    return 0
