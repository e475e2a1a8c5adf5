"""Replay recorded Kafka sessions on the wire against another broker (issue 8).

load.py    recording → filtered connections/requests with their recorded rhythm
rewrite.py pure rewrites (correlation ids, producer ids + CRC, fetch sessions, groups, topics)
engine.py  asyncio/uvloop engine, optionally through an in-process recording proxy
cli.py     `kafkatap replay`
"""
