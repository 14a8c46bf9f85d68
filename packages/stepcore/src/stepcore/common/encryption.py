"""`Encryption`: the keys a store encrypts its bodies and media blobs with (AES-256-GCM).

Each ciphertext is stored with the id of the key that made it and a short fingerprint of that
key, so a reader holding several keys picks the right one, and a reader given a different key
under the same id says so instead of reporting every record as damaged. The active key encrypts
what is written; every other key only decrypts, which is how keys are rotated (`stepcore rekey`
rewrites stored data under the active key).

Keys for a store opened from a URL come from the environment or a key file, never from the URL:
`Encryption.from_text` reads `id=base64key` entries separated by newlines, commas or semicolons,
the first one active unless an `active=id` entry says otherwise.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

__all__ = (
    'DEFAULT_KEYS_ENV',
    'Encryption',
    'EncryptionKeyError',
    'generate_key',
)

DEFAULT_KEYS_ENV: Final = 'STEPCORE_ENCRYPTION_KEYS'
"""The environment variable `Encryption.from_env` reads by default."""

_BLOB_MAGIC: Final = b'SCE1'
_BLOB_AAD: Final = b'stepcore-blob'
_KEY_ID = re.compile(r'[A-Za-z0-9_.-]{1,64}')
_NONCE_BYTES: Final = 12
_INSTALL = 'install it with `pip install "stepcore[encryption]"`'


class EncryptionKeyError(RuntimeError):
    """Stored data needs a key that was not given, or was given with other key bytes.

    Not a kind of damage: the data may be intact, and reading it with the right key works.
    """

    def __init__(self, message: str, *, key_id: str) -> None:
        super().__init__(message)
        self.key_id = key_id


def generate_key() -> bytes:
    """A new random 256-bit key (keep it secret and keep a copy: data encrypted with it needs it)."""
    return os.urandom(32)


def _aesgcm(key: bytes) -> Any:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(f'stepcore.Encryption needs the `cryptography` package: {_INSTALL}') from error
    return AESGCM(key)


def fingerprint(key: bytes) -> str:
    """A short public tag of a key (8 hex digits): tells a wrong key from damaged data."""
    return hashlib.blake2b(key, digest_size=4, person=b'stepcore-key').hexdigest()


class Encryption:
    """Keys to encrypt stored data with: `keys` maps a key id to 16, 24 or 32 key bytes; `active`
    names the key new data is encrypted with (the only key, when there is one)."""

    generate_key = staticmethod(generate_key)

    def __init__(self, keys: Mapping[str, bytes], active: str | None = None) -> None:
        if not keys:
            raise ValueError('Encryption needs at least one key: pass keys={"k1": Encryption.generate_key()}')
        checked: dict[str, bytes] = {}
        for key_id, key in keys.items():
            if not isinstance(key_id, str) or not _KEY_ID.fullmatch(key_id):  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(f'encryption key id {key_id!r} is not valid: use 1-64 of A-Z a-z 0-9 _ . -')
            if not isinstance(key, bytes) or len(key) not in (16, 24, 32):  # pyright: ignore[reportUnnecessaryIsInstance]
                size = len(key) if isinstance(key, bytes) else type(key).__name__  # pyright: ignore[reportUnnecessaryIsInstance]
                raise ValueError(
                    f'encryption key {key_id!r} must be 16, 24 or 32 bytes (got {size}): '
                    'make one with stepcore.Encryption.generate_key()'
                )
            checked[key_id] = key
        if active is None:
            if len(checked) > 1:
                raise ValueError(f'Encryption got keys {sorted(checked)}: say which one encrypts new data with active=')
            active = next(iter(checked))
        if active not in checked:
            raise ValueError(f'active={active!r} is not one of the encryption keys {sorted(checked)}')
        self.active = active
        self._keys = checked
        self._ciphers: dict[str, Any] = {}
        self._fingerprints = {key_id: fingerprint(key) for key_id, key in checked.items()}

    def __repr__(self) -> str:  # never shows key bytes
        return f'Encryption(keys={sorted(self._keys)}, active={self.active!r})'

    @property
    def key_ids(self) -> list[str]:
        return sorted(self._keys)

    # -- construction from text ----------------------------------------------------------------

    @classmethod
    def from_text(cls, text: str, *, source: str = 'key text') -> Encryption:
        """Keys from `id=base64key` entries (newline, comma or semicolon separated; `#` comments);
        the first key is active unless an `active=id` entry names another."""
        keys: dict[str, bytes] = {}
        active: str | None = None
        first: str | None = None
        for raw in re.split(r'[\n,;]', text):
            entry = raw.split('#', 1)[0].strip()
            if not entry:
                continue
            name, sep, value = entry.partition('=')
            name, value = name.strip(), value.strip()
            if not sep or not name or not value:
                raise ValueError(f'{source}: entry {name or entry[:8]!r}... is not `id=base64key`')
            if name == 'active':
                active = value
                continue
            try:
                keys[name] = base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError(f'{source}: the key {name!r} is not valid base64') from None
            first = first or name
        if not keys:
            raise ValueError(f'{source} holds no keys: write `k1=<base64 key>` (see stepcore.Encryption.generate_key)')
        return cls(keys, active=active or first)

    @classmethod
    def from_env(cls, variable: str = DEFAULT_KEYS_ENV) -> Encryption:
        """Keys from an environment variable (see `from_text`)."""
        text = os.environ.get(variable)
        if not text:
            raise ValueError(f'environment variable {variable} is not set: set it to `k1=<base64 key>`')
        return cls.from_text(text, source=f'environment variable {variable}')

    @classmethod
    def from_file(cls, path: str | Path) -> Encryption:
        """Keys from a key file (see `from_text`); it should be readable by its owner only."""
        file = Path(path)
        return cls.from_text(file.read_text(encoding='utf-8'), source=f'key file {str(file)!r}')

    @staticmethod
    def key_text(key_id: str, key: bytes) -> str:
        """`id=base64key`: a key as `from_text` reads it."""
        return f'{key_id}={base64.b64encode(key).decode()}'

    # -- encrypting ----------------------------------------------------------------------------

    def _cipher(self, key_id: str) -> Any:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            cipher = self._ciphers[key_id] = _aesgcm(self._keys[key_id])
        return cipher

    def encrypt(self, plaintext: bytes, aad: bytes = b'') -> tuple[str, str, bytes]:
        """`(key id, key fingerprint, nonce + ciphertext + tag)` under the active key."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._cipher(self.active).encrypt(nonce, plaintext, aad or None)
        return self.active, self._fingerprints[self.active], nonce + sealed

    def seal_blob(self, data: bytes) -> bytes:
        """`data` encrypted under the active key, deterministically (the nonce is a keyed hash of
        `data`, so equal contents give equal blobs): magic, key id, fingerprint, nonce, ciphertext."""
        key_id = self.active
        nonce = hashlib.blake2b(
            data, key=self._keys[key_id], digest_size=_NONCE_BYTES, person=b'stepcore-blob'
        ).digest()
        sealed = self._cipher(key_id).encrypt(nonce, data, _BLOB_AAD)
        head = _BLOB_MAGIC + bytes([len(key_id)]) + key_id.encode() + bytes.fromhex(self._fingerprints[key_id])
        return head + nonce + sealed

    @staticmethod
    def is_sealed_blob(blob: bytes) -> bool:
        return blob.startswith(_BLOB_MAGIC)

    def blob_key_id(self, blob: bytes) -> str | None:
        """The key id a `seal_blob` blob was encrypted with (`None`: not an encrypted blob)."""
        if not blob.startswith(_BLOB_MAGIC) or len(blob) <= len(_BLOB_MAGIC):
            return None
        size = blob[len(_BLOB_MAGIC)]
        return blob[len(_BLOB_MAGIC) + 1 : len(_BLOB_MAGIC) + 1 + size].decode('ascii', 'replace')

    def open_blob(self, blob: bytes, *, what: str = 'a blob') -> bytes:
        """The content of a `seal_blob` blob; a blob without its magic is returned as it is."""
        if not blob.startswith(_BLOB_MAGIC):
            return blob
        try:
            size = blob[len(_BLOB_MAGIC)]
            start = len(_BLOB_MAGIC) + 1
            key_id = blob[start : start + size].decode('ascii')
            fp = blob[start + size : start + size + 4].hex()
        except (IndexError, UnicodeDecodeError):
            raise ValueError(f'{what} is damaged: its encryption header does not read') from None
        return self.decrypt(key_id, fp, blob[start + size + 4 :], _BLOB_AAD)

    def check_key(self, key_id: str, key_fingerprint: str | None) -> None:
        """Raise `EncryptionKeyError` unless the key `key_id` is held, with this fingerprint."""
        if key_id not in self._keys:
            raise EncryptionKeyError(
                f'stored data is encrypted with key {key_id!r}, which is not among the keys given '
                f'({", ".join(map(repr, self.key_ids))}): add key {key_id!r} to the Encryption keys',
                key_id=key_id,
            )
        if key_fingerprint is not None and key_fingerprint != self._fingerprints[key_id]:
            raise EncryptionKeyError(
                f'the key given as {key_id!r} is not the key stored data was encrypted with under that id '
                f'(fingerprint {self._fingerprints[key_id]}, stored {key_fingerprint}): give the right key bytes',
                key_id=key_id,
            )

    def decrypt(self, key_id: str, key_fingerprint: str | None, blob: bytes, aad: bytes = b'') -> bytes:
        """The plaintext of `encrypt`'s blob; `EncryptionKeyError` for a key not held (or other
        bytes under its id), `ValueError` when the blob is damaged (its tag does not check)."""
        self.check_key(key_id, key_fingerprint)
        if len(blob) < _NONCE_BYTES + 16:
            raise ValueError(f'ciphertext under key {key_id!r} is truncated ({len(blob)} bytes)')
        from cryptography.exceptions import InvalidTag

        try:
            return self._cipher(key_id).decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], aad or None)
        except InvalidTag:
            raise ValueError(
                f'ciphertext under key {key_id!r} fails its integrity check: it is damaged or was moved'
            ) from None
