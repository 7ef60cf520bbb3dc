"""The tests' S3 endpoint on 127.0.0.1: the benchmark's (moto's S3 server, the emulation
mosaic streaming's own tests use, in a process of its own, its requests counted from its log,
stopped when the test is done or this process dies)."""

from benchmarks.streaming.servers import S3Server

__all__ = ["S3Server"]
