"""rnncore.torch.LSTM trained under DistributedDataParallel (gloo, two processes on
localhost) ends with the weights of the same training in one process."""

import os
import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

STEPS, N, T, I, H = 4, 8, 6, 3, 5  # noqa: E741


def make_model():
    import rnncore.torch as rt

    torch.manual_seed(0)
    return rt.LSTM(I, H, num_layers=2, batch_first=True, dtype=torch.float64)


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, N, T, I, generator=g, dtype=torch.float64)
    y = torch.randn(STEPS, N, T, H, generator=g, dtype=torch.float64)
    return x, y


def train(model, xs, ys):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        out, _ = model(x)
        torch.nn.functional.mse_loss(out, y).backward()
        opt.step()


def worker(rank, port, path):
    import rnncore

    rnncore.set_num_threads(1)  # two processes on two cores
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        model = torch.nn.parallel.DistributedDataParallel(make_model())
        xs, ys = data()
        half = slice(rank * N // 2, (rank + 1) * N // 2)  # each process half of each batch
        train(model, xs[:, half], ys[:, half])
        if rank == 0:
            torch.save(model.module.state_dict(), path)
        # Both ranks done with every collective before either tears gloo down (a rank that
        # destroys its group while the peer's gloo threads still talk to it can abort).
        del model
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_ddp_matches_one_process(tmp_path):
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    path = str(tmp_path / "ddp.pt")
    mp.spawn(worker, args=(free_port(), path), nprocs=2, join=True)
    single = make_model()
    train(single, *data())
    ddp = torch.load(path)
    for name, value in single.state_dict().items():
        # The mean over two halves is the mean over the batch: equal up to rounding.
        assert torch.allclose(ddp[name], value, rtol=1e-12, atol=1e-14), name
