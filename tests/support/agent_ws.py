"""The agent WebSocket protocol driven in process (Channels' WebsocketCommunicator)."""

import asyncio
import io

from channels.db import database_sync_to_async
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.core.management import call_command

from fleet.agent.plugins import catalogue
from fleet.routing import websocket_urlpatterns


def mint_device_token(*args):
    """A device token; without arguments one of unlimited uses (a test enrols as many agents as it needs)."""
    out = io.StringIO()
    call_command("mint_device_token", "--name", "lab", *(args or ("--unlimited-uses",)), stdout=out)
    return out.getvalue().strip()


def register_msg(agent_id, credential, **extra):
    return {"type": "register", "agent_id": agent_id, "credential": credential, "hostname": "web-1", "os": "linux",
            "arch": "x86_64", "agent_version": "0.1.0", "attributes": {"kernel": "6.1"}, "tags": {},
            "plugins": catalogue(), **extra}


def agent_endpoint(client=("127.0.0.1", 40000)):
    """The agent routes, as daphne would call them for a peer at ``client``."""
    router = URLRouter(websocket_urlpatterns)

    async def app(scope, receive, send):
        return await router({**scope, "client": list(client)}, receive, send)

    return app


async def connect(client=("127.0.0.1", 40000)):
    comm = WebsocketCommunicator(agent_endpoint(client), "/agent/v1/ws")
    connected, _ = await comm.connect()
    assert connected
    return comm


async def send(comm, msg):
    await comm.send_json_to(msg)
    return await comm.receive_json_from(timeout=5)


async def enrolled_agent(token, **register_extra):
    """A connection that enrolled and registered; returns (communicator, agent_id, credential, registered)."""
    comm = await connect()
    reply = await send(comm, {"type": "enroll", "token": token, "hostname": "web-1"})
    assert reply["type"] == "enrolled"
    registered = await send(comm, register_msg(reply["agent_id"], reply["credential"], **register_extra))
    assert registered["type"] == "registered"
    return comm, reply["agent_id"], reply["credential"], registered


async def closed_with(comm, code):
    out = await comm.receive_output(timeout=5)
    assert out["type"] == "websocket.close" and out["code"] == code, out
    await comm.disconnect(code)
    return out.get("reason", "")


async def until(check, timeout=5.0):
    for _ in range(int(timeout / 0.05)):
        if await database_sync_to_async(check)():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")
