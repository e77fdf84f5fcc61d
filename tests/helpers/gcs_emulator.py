"""A Google Cloud Storage API on 127.0.0.1 for tests: gcp-storage-emulator (PyPI), in memory,
with the clients the stack uses pointed at it.

  with gcs_emulator.serving("bucket") as env:   # env: the variables a subprocess needs
    epath.Path("gs://bucket/x").write_text("...")
    with gcs_emulator.counting_uploads() as uploaded:   # {object name: bytes uploaded to it}
      ...

The clients and the variable each reads:
  google-cloud-storage, gcsfs (etils.epath's gs:// backend, tensorboardX's GCS writer)
                                     STORAGE_EMULATOR_HOST
  tensorstore (Orbax's arrays)       TENSORSTORE_GCS_HTTP_URL
Without credentials on the machine both fall back to anonymous requests, which the emulator
serves; GCE_METADATA_HOST points the metadata-server probe at a closed port, so it fails at once
instead of waiting for a timeout. GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false: gcsfs (2026.x) asks
the Storage Control API for every bucket's type, which the emulator does not serve; each ask
waits seconds before falling back to the plain client this setting picks at once.

One gap of the emulator (2026.7.19) is filled here: its media downloads carry no
`x-goog-generation` header, which GCS always sends and tensorstore needs (it fails the read with
"Malformed StorageGeneration", so Orbax could neither save nor restore); `_with_generation_headers`
adds it from the object's own record. Nothing else of the emulator is changed.
"""

import contextlib
import logging
import os
import socket
from typing import Dict, Iterator


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _with_generation_headers() -> None:
  """Makes the emulator's media downloads send the object's generation headers (idempotent)."""
  from gcp_storage_emulator.handlers import objects
  if getattr(objects.download, "_metonymy_generation_headers", False):
    return
  original = objects.download

  def download(request, response, storage, *args, **kwargs):
    try:
      record = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except Exception:  # pylint: disable=broad-except  (NotFound: the original answers 404)
      record = None
    if record is not None:
      response["x-goog-generation"] = str(record.get("generation", ""))
      response["x-goog-metageneration"] = str(record.get("metageneration", "1"))
    return original(request, response, storage, *args, **kwargs)

  download._metonymy_generation_headers = True
  objects.download = download  # `objects.get` (?alt=media, tensorstore's route) calls it.


@contextlib.contextmanager
def serving(bucket: str = "bucket") -> Iterator[Dict[str, str]]:
  """Starts the emulator with `bucket`, sets the variables in os.environ (restored after) and
  yields them, for subprocesses' environments too."""
  from gcp_storage_emulator.server import create_server
  _with_generation_headers()
  # The emulator logs a traceback for every client that closes a connection early; quiet.
  logging.getLogger("gcp_storage_emulator").setLevel(logging.CRITICAL)
  port = _free_port()
  server = create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  server.start()
  # A client closing a connection early (normal for ranged reads) is no test failure: without
  # this, socketserver prints a BrokenPipe traceback for each into the test log.
  server._api._httpd.handle_error = lambda request, client_address: None
  url = f"http://127.0.0.1:{port}"
  env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
         "GOOGLE_CLOUD_PROJECT": "metonymy-test", "GCE_METADATA_HOST": f"127.0.0.1:{_free_port()}",
         "GCE_METADATA_IP": f"127.0.0.1:{_free_port()}", "NO_GCE_CHECK": "True",
         "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  # gcsfs reads GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT once, at import: in this process it may be
  # imported already, so register its plain filesystem for gs:// directly (subprocesses read
  # the variable).
  import fsspec
  import gcsfs.core
  for protocol in ("gs", "gcs"):
    fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
  gcsfs.core.GCSFileSystem.clear_instance_cache()
  try:
    yield env
  finally:
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
    server.stop()


@contextlib.contextmanager
def counting_uploads() -> Iterator[Dict[str, int]]:
  """{object name: bytes of every upload to it, summed} for the uploads made inside (every
  finished upload, simple or resumable, ends in the emulator's Storage.create_file)."""
  from gcp_storage_emulator import storage
  uploaded: Dict[str, int] = {}
  original = storage.Storage.create_file

  def create_file(self, bucket_name, file_name, content, *args, **kwargs):
    uploaded[file_name] = uploaded.get(file_name, 0) + len(content or b"")
    return original(self, bucket_name, file_name, content, *args, **kwargs)

  storage.Storage.create_file = create_file
  try:
    yield uploaded
  finally:
    storage.Storage.create_file = original
