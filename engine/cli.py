"""`llmdeploy-engine serve ...` (also `python -m llmdeploy_engine.cli serve ...`) and `flags --json`.

The parser lives in `cli_args` (no torch); the engine and the HTTP server are imported only when
serving.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import socket
import sys
import threading

from llmdeploy_engine.cli_args import (
    build_parser,
    config_from_args,
    flag_catalogue,
    flags_json,
    resolve_api_key,
    serve_parser,
)
from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.facts import DRAIN_TIMEOUT_S

LOG_FORMAT = "%(levelname)s %(asctime)s %(name)s: %(message)s"
# on SIGTERM the server stops accepting, lets in-flight requests finish for DRAIN_TIMEOUT_S
# (engine/facts.py: rendered Kubernetes pods must give it more), then answers the rest 503


def _check_model_path(config: EngineConfig, parser: argparse.ArgumentParser) -> None:
    if config.model.startswith("random:"):
        return
    if not os.path.exists(config.model):
        parser.error(
            f"--model {config.model!r}: no such file or folder (give a GGUF file, a checkpoint "
            f"folder, or random:<catalog id>)"
        )
    if config.tokenizer and not os.path.exists(config.tokenizer):
        parser.error(f"--tokenizer {config.tokenizer!r}: no such file or folder")


def _check_port_free(host: str, port: int, parser: argparse.ArgumentParser) -> None:
    """Fail before the (slow) model load when the address is taken."""
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            parser.error(f"--host {host} --port {port}: cannot listen there ({e.strerror})")


def serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    serve_cli = serve_parser()  # its usage line names the `serve` command
    config = config_from_args(args, serve_cli)
    _check_model_path(config, serve_cli)
    logging.basicConfig(
        level=getattr(logging, args.uvicorn_log_level.upper(), logging.INFO)
        if args.uvicorn_log_level != "trace"
        else logging.DEBUG,
        format=LOG_FORMAT,
    )

    from llmdeploy_engine import async_engine
    from llmdeploy_engine.server import request_body
    from llmdeploy_engine.server.app import build_app
    from llmdeploy_engine.server.drain import DrainingServer, uvicorn_config
    from llmdeploy_engine.server.state import ServerSettings

    names = tuple(args.served_model_name or (config.model,))
    settings = ServerSettings(
        served_model_names=names,
        model_path=config.model,
        api_key=resolve_api_key(args),
        block_size=config.block_size,
        max_num_seqs=config.max_num_seqs,
        max_queue_len=config.max_queue_len,
        max_num_seqs_per_request=args.max_num_seqs_per_request,
        max_num_batched_tokens=config.max_num_batched_tokens,
        dtype=config.dtype,
        device=config.device,
        queue_full_errors=(async_engine.QueueFullError,),
        shutdown_errors=(async_engine.EngineShutdownError,),
        log_requests=not args.disable_log_requests,
        grammar_compile_timeout_s=args.grammar_compile_timeout_s,
    )

    _check_port_free(args.host, args.port, serve_cli)
    logger = logging.getLogger("llmdeploy_engine")
    logger.info("loading %s for http://%s:%d", config.model, args.host, args.port)
    try:
        engine = async_engine.AsyncLLMEngine.from_config(config)
    except (ValueError, OSError) as e:  # the engine's wording for a model or budget that cannot work
        print(f"llmdeploy-engine serve: error: {e}", file=sys.stderr)
        sys.exit(2)
    getattr(engine.tokenizer, "max_chars_per_token", None)  # computed once now, not in the first request
    try:  # the grammar compiler reads the vocabulary (~1 s): now, not in the first constrained request
        engine.grammar_compiler()
        settings = dataclasses.replace(settings, start_grammar_workers=True)
    except Exception as e:  # no xgrammar, or a tokenizer it cannot read: constrained requests say so
        logger.info("structured outputs unavailable: %s", e)
    app = build_app(settings, engine=engine)
    # the process that parses big request bodies starts now, not on the first big body
    threading.Thread(target=request_body.parser_pool, name="llmdeploy-parser-start", daemon=True).start()
    config_http = uvicorn_config(
        app,
        DRAIN_TIMEOUT_S,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        access_log=not args.disable_log_requests,
    )
    DrainingServer(config_http, DRAIN_TIMEOUT_S, engine.shutdown).run()


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "flags":
        if args.json:
            print(flags_json())
        else:
            for row in flag_catalogue():
                print(f"{', '.join(row['option_strings']):<40} {row['help']}")
        return
    if args.command == "serve":
        serve(args, parser)
        return
    parser.error(f"unknown command {args.command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
