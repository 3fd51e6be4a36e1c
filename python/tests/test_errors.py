"""What keeps a caller from a loop: each is an exception under RunloopError."""

from __future__ import annotations

import asyncio
import socket
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

import runloop
from conftest import Server, free_port, require


async def test_a_refused_credential_is_a_connect_error(server: Server) -> None:
    client = await runloop.connect(server.url, token="not-the-token")
    with pytest.raises(runloop.ConnectError, match="is the credential right"):
        await client.start("demo", memory="64M")
    await client.close()


async def test_no_credential_where_one_is_wanted_says_so(server: Server) -> None:
    client = await runloop.connect(server.url, token="")
    with pytest.raises(runloop.ConnectError, match="it wants a credential, and none was sent"):
        await client.start("demo", memory="64M")
    await client.close()


async def test_an_unknown_image_is_refused_with_the_servers_error(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        with pytest.raises(runloop.RunRefused) as refused:
            await client.start("no-such-image", memory="64M")
        assert isinstance(refused.value.error, dict)
        assert "no-such-image" in str(refused.value.error)
        assert isinstance(refused.value, runloop.RunloopError)
        # The connection is still good.
        run = await client.start("demo", memory="64M")
        await run.stop()


async def test_a_registry_image_the_server_does_not_allow_is_refused(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        with pytest.raises(runloop.RunRefused) as refused:
            await client.start(image={"registry": {"reference": "registry.invalid/a/b:1"}}, memory="64M")
        assert refused.value.error


async def test_nothing_listening_is_a_connect_error() -> None:
    with pytest.raises(runloop.ConnectError):
        await runloop.connect(f"ws://127.0.0.1:{free_port()}")


async def test_a_server_that_never_answers_times_out() -> None:
    # The kernel accepts the TCP connection; nothing answers the upgrade.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = "ws://127.0.0.1:%d" % silent.getsockname()[1]
        began = asyncio.get_running_loop().time()
        with pytest.raises(runloop.ConnectTimeout) as timed_out:
            await runloop.connect(url, connect_timeout=0.3)
        assert isinstance(timed_out.value, TimeoutError)
        assert isinstance(timed_out.value, runloop.ConnectError)
        assert asyncio.get_running_loop().time() - began < 2


async def test_bad_arguments_are_value_errors(server: Server) -> None:
    async with runloop.connect(server.url, token=server.token) as client:
        with pytest.raises(ValueError, match="not an image name"):
            await client.start("Not A Name")
        with pytest.raises(ValueError, match="not a digest"):
            await client.start("demo", digest="md5:abc")
        with pytest.raises(ValueError, match="byte count"):
            await client.start("demo", memory="lots")
        with pytest.raises(ValueError, match="image must be"):
            await client.start(image={"elsewhere": {}})
    with pytest.raises(ValueError, match="connect_timeout"):
        await runloop.connect(server.url, connect_timeout=-1)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    require("openssl", "openssl")
    d = tmp_path_factory.mktemp("tls")
    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *curve, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
            "-days", "1", "-subj", "/CN=runloop python tests CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign")
    openssl("req", *curve, "-keyout", str(d / "server.key"), "-out", str(d / "server.csr"),
            "-subj", "/CN=127.0.0.1")
    (d / "ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "extendedKeyUsage=serverAuth\n"
    )
    openssl("x509", "-req", "-in", str(d / "server.csr"), "-CA", str(d / "ca.pem"),
            "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-out", str(d / "server.pem"),
            "-days", "1", "-extfile", str(d / "ext"))
    yield d


async def test_tls_with_ca(certificates: Path) -> None:
    tls = Server(["--tls-cert", str(certificates / "server.pem"),
                  "--tls-key", str(certificates / "server.key")])
    try:
        assert tls.url.startswith("wss://")
        async with runloop.connect(tls.url, token=tls.token, ca=certificates / "ca.pem") as client:
            run = await client.start("demo", memory="64M")
            async with run.loop("over TLS") as stream:
                async for _ in stream:
                    pass
            assert stream.outcome.kind == "finished"
            await run.stop()
        # Without the CA, the platform's roots do not vouch for it.
        with pytest.raises(runloop.ConnectError, match="certificate"):
            await runloop.connect(tls.url, token=tls.token)
        # A CA file that is not there is named.
        with pytest.raises(runloop.ConnectError, match="certificate authorities"):
            await runloop.connect(tls.url, ca=certificates / "missing.pem")
    finally:
        tls.stop()
