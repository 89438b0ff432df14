"""producer.py DIR N SIZE: writes N files of SIZE KiB through pydyad's
dyad_open (each published when it closes), as upstream's pydyad_spsc
producer."""
import os
import sys

from pydyad import dyad_open


def content(i, size):
    pattern = bytes((i * 11 + k) % 251 for k in range(251))
    return (pattern * (size // 251 + 1))[:size]


def main():
    directory, n, kib = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(directory, exist_ok=True)
    for i in range(n):
        path = os.path.join(directory, f"data{i}.npy")
        with dyad_open(path, "wb") as f:
            f.write(content(i, kib * 1024))
        print(f"produced {path}", flush=True)


if __name__ == "__main__":
    main()
