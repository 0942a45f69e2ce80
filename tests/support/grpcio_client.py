"""A gRPC client on vxmgrd's unix socket with grpcio's defaults: a plain
insecure_channel("unix:PATH"), whose :authority is the %-encoded path.

Messages go in and out as hex-encoded protobuf, one per line, so that the
test builds and reads them with the project's own types.

    grpcio_client.py SOCKET unary METHOD REQUEST_HEX
        prints the response
    grpcio_client.py SOCKET stream METHOD STOP_PREFIX_HEX < requests
        sends the requests (one per line), closes its side, and prints
        responses until one starts with STOP_PREFIX_HEX
"""

import sys

import grpc


def main():
    socket, kind, method = sys.argv[1:4]
    with grpc.insecure_channel(f"unix:{socket}") as channel:
        if kind == "unary":
            call = channel.unary_unary(method)
            print(call(bytes.fromhex(sys.argv[4]), timeout=30).hex())
        elif kind == "stream":
            stop = sys.argv[4]
            requests = [bytes.fromhex(line) for line in sys.stdin.read().split()]
            responses = channel.stream_stream(method)(iter(requests), timeout=30)
            for response in responses:
                print(response.hex(), flush=True)
                if response.hex().startswith(stop):
                    responses.cancel()
                    break
        else:
            sys.exit(f"unknown call kind {kind}")


if __name__ == "__main__":
    main()
