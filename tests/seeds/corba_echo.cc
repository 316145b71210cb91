// SPDX-License-Identifier: Apache-2.0 OR MIT
// corba_echo - omniORB server and client of Seeds::Echo (seeds_echo.idl), every reply checked.
//
//   corba_echo server PORT IORFILE [-ORB...]         serves on giop:tcp:127.0.0.1:PORT only
//   corba_echo check IORFILE                          null, echo 0 B..1 MB, 4000 oneways: data
//   corba_echo lat IORFILE SECONDS                    null RPC round trips: median, p99 (us)
//   corba_echo rate IORFILE SECONDS THREADS           null RPCs/s from THREADS client threads
//   corba_echo oneway IORFILE SECONDS SIZE            oneway throughput at the server, MB/s
//
// The server lets one thread serve each connection (maxServerThreadPerConnection 1) so that
// oneways from one client arrive in order; it writes its IOR to IORFILE once it is ready.
// Every mode prints "ok" last; a wrong byte prints "MISMATCH ..." and exits 1.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "seeds_echo.hh"

static double now()
{
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

static unsigned char pat(unsigned long i, unsigned long seq) { return (unsigned char)(i * 131 + seq * 7 + 3); }

static void fill(Seeds::Block &b, unsigned long n, unsigned long long seq)
{
    b.length(n);
    unsigned char *p = b.get_buffer();
    for (unsigned long i = 0; i < n; i++) p[i] = pat(i, seq);
    if (n >= 8) {
        memcpy(p, &seq, 8);
        memcpy(p + n - 8, &seq, 8);
    }
}

class Echo_i : public POA_Seeds::Echo {
    std::mutex mu;
    unsigned long long blocks = 0, bytes = 0, bad = 0;
    double first = 0, last = 0;
    Seeds::Block want;

  public:
    void null_op() override {}
    Seeds::Block *mirror(const Seeds::Block &b) override
    {
        Seeds::Block *r = new Seeds::Block(b.length());
        r->length(b.length());
        const unsigned char *s = b.get_buffer();
        unsigned char *d = r->get_buffer();
        for (CORBA::ULong i = 0; i < b.length(); i++) d[i] = s[i] ^ 0xff;
        return r;
    }
    // Stamps (the sequence number at head and tail) on every block, every byte on the first,
    // every 64th and every small one.
    void push(const Seeds::Block &b) override
    {
        std::lock_guard<std::mutex> g(mu);
        double t = now();
        if (blocks == 0) first = t;
        last = t;
        unsigned long n = b.length();
        const unsigned char *p = b.get_buffer();
        bool ok = true;
        if (n >= 8 && (blocks % 64 != 0) && n > 256) {
            unsigned long long h, tl;
            memcpy(&h, p, 8);
            memcpy(&tl, p + n - 8, 8);
            ok = h == blocks && tl == blocks;
        } else {
            fill(want, n, blocks);
            ok = memcmp(want.get_buffer(), p, n) == 0;
        }
        bad += !ok;
        blocks++;
        bytes += n;
    }
    Seeds::Stats totals() override
    {
        std::lock_guard<std::mutex> g(mu);
        Seeds::Stats s;
        s.blocks = blocks;
        s.bytes = bytes;
        s.bad = bad;
        s.seconds = last - first;
        return s;
    }
    void reset() override
    {
        std::lock_guard<std::mutex> g(mu);
        blocks = bytes = bad = 0;
        first = last = 0;
    }
};

static int serve(CORBA::ORB_var orb, const char *iorfile)
{
    CORBA::Object_var o = orb->resolve_initial_references("RootPOA");
    PortableServer::POA_var poa = PortableServer::POA::_narrow(o);
    Echo_i *servant = new Echo_i();
    PortableServer::ObjectId_var id = poa->activate_object(servant);
    CORBA::Object_var ref = servant->_this();
    servant->_remove_ref();
    CORBA::String_var ior = orb->object_to_string(ref);
    std::string tmp = std::string(iorfile) + ".tmp";
    {
        std::ofstream f(tmp);
        f << (const char *)ior << "\n";
    }
    PortableServer::POAManager_var pm = poa->the_POAManager();
    pm->activate();
    if (rename(tmp.c_str(), iorfile) != 0) return 1;
    orb->run();
    return 0;
}

static Seeds::Echo_ptr get(CORBA::ORB_var orb, const char *iorfile)
{
    std::ifstream f(iorfile);
    std::string ior;
    std::getline(f, ior);
    CORBA::Object_var o = orb->string_to_object(ior.c_str());
    return Seeds::Echo::_narrow(o);
}

static int check(Seeds::Echo_var e)
{
    for (int i = 0; i < 100; i++) e->null_op();
    unsigned long sizes[] = {0, 1, 7, 8, 100, 4096, 65536, 300000, 1 << 20};
    for (unsigned long n : sizes)
        for (unsigned long long seq = 0; seq < 3; seq++) {
            Seeds::Block b;
            fill(b, n, seq + n);
            Seeds::Block_var r = e->mirror(b);
            if (r->length() != n) {
                printf("MISMATCH echo %lu: %u bytes back\n", n, (unsigned)r->length());
                return 1;
            }
            for (unsigned long i = 0; i < n; i++)
                if ((unsigned char)(r[i] ^ 0xff) != b[i]) {
                    printf("MISMATCH echo %lu byte %lu\n", n, i);
                    return 1;
                }
        }
    // Oneways of several sizes, in order, then a twoway call: the server counted them all.
    e->reset();
    unsigned long long seq = 0, bytes = 0;
    unsigned long osz[] = {16, 1000, 4096, 70000};
    for (unsigned long n : osz)
        for (int i = 0; i < 1000; i++) {
            Seeds::Block b;
            fill(b, n, seq++);
            e->push(b);
            bytes += n;
        }
    // Oneways are not acknowledged: wait (bounded) until the server has them all.
    Seeds::Stats s = e->totals();
    for (int i = 0; i < 200 && s.blocks < seq; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        s = e->totals();
    }
    if (s.blocks != seq || s.bytes != bytes || s.bad != 0) {
        printf("MISMATCH oneway: %llu blocks %llu bytes %llu bad, sent %llu blocks %llu bytes\n",
               (unsigned long long)s.blocks, (unsigned long long)s.bytes,
               (unsigned long long)s.bad, seq, bytes);
        return 1;
    }
    printf("check null 100 echo 27 oneway %llu ok\n", seq);
    return 0;
}

static int lat(Seeds::Echo_var e, double secs)
{
    std::vector<double> rt;
    for (int i = 0; i < 200; i++) e->null_op();
    double end = now() + secs;
    while (now() < end && rt.size() < 5000000) {
        double a = now();
        e->null_op();
        rt.push_back(now() - a);
    }
    std::sort(rt.begin(), rt.end());
    double sum = 0;
    for (double x : rt) sum += x;
    printf("lat calls %zu median_us %.3f p99_us %.3f mean_us %.3f\n", rt.size(),
           rt[rt.size() / 2] * 1e6, rt[rt.size() * 99 / 100] * 1e6, sum / rt.size() * 1e6);
    return 0;
}

static int rate(Seeds::Echo_var e, double secs, int threads)
{
    std::atomic<unsigned long long> calls{0};
    std::atomic<int> failed{0};
    for (int i = 0; i < 20; i++) e->null_op();
    double start = now(), end = start + secs;
    std::vector<std::thread> ts;
    for (int t = 0; t < threads; t++)
        ts.emplace_back([&] {
            unsigned long long n = 0;
            try {
                while (now() < end) {
                    e->null_op();
                    n++;
                }
            } catch (...) {
                failed++;
            }
            calls += n;
        });
    for (auto &t : ts) t.join();
    double took = now() - start;
    if (failed) {
        printf("MISMATCH rate: %d threads failed\n", (int)failed);
        return 1;
    }
    printf("rate threads %d calls %llu per_s %.1f\n", threads, (unsigned long long)calls,
           calls / took);
    return 0;
}

static int oneway(Seeds::Echo_var e, double secs, unsigned long size)
{
    e->reset();
    Seeds::Block b;
    fill(b, size, 0);
    unsigned char *p = b.get_buffer();
    unsigned long long seq = 0;
    double end = now() + secs;
    while (now() < end) {
        // Every byte is rewritten for each 64th block (the server checks those in full), the
        // stamps for the others: a block's contents are its own, never the last one's.
        if (seq % 64 == 0 || size <= 256) fill(b, size, seq);
        else if (size >= 8) {
            memcpy(p, &seq, 8);
            memcpy(p + size - 8, &seq, 8);
        }
        e->push(b);
        seq++;
    }
    Seeds::Stats s = e->totals();
    for (int i = 0; i < 400 && s.blocks < seq; i++) {
        std::this_thread::sleep_for(std::chrono::milliseconds(25));
        s = e->totals();
    }
    if (s.blocks != seq || s.bad != 0) {
        printf("MISMATCH oneway size %lu: %llu of %llu blocks, %llu bad\n", size,
               (unsigned long long)s.blocks, seq, (unsigned long long)s.bad);
        return 1;
    }
    printf("oneway size %lu blocks %llu MBps %.2f\n", size, seq,
           s.seconds > 0 ? s.bytes / s.seconds / 1e6 : 0.0);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: corba_echo server PORT IORFILE | check|lat|rate|oneway IORFILE ...\n");
        return 2;
    }
    std::string mode = argv[1];
    try {
        if (mode == "server") {
            std::string ep = std::string("giop:tcp:127.0.0.1:") + argv[2];
            const char *opts[][2] = {{"endPoint", ep.c_str()},
                                     {"maxServerThreadPerConnection", "1"},
                                     {nullptr, nullptr}};
            int ac = 1;
            char *av[] = {argv[0], nullptr};
            CORBA::ORB_var orb = CORBA::ORB_init(ac, av, "omniORB4", opts);
            return serve(orb, argv[3]);
        }
        const char *opts[][2] = {{"maxGIOPConnectionPerServer", "16"}, {nullptr, nullptr}};
        int ac = 1;
        char *av[] = {argv[0], nullptr};
        CORBA::ORB_var orb = CORBA::ORB_init(ac, av, "omniORB4", opts);
        Seeds::Echo_var e = get(orb, argv[2]);
        int rc = 2;
        if (mode == "check") rc = check(e);
        else if (mode == "lat" && argc > 3) rc = lat(e, atof(argv[3]));
        else if (mode == "rate" && argc > 4) rc = rate(e, atof(argv[3]), atoi(argv[4]));
        else if (mode == "oneway" && argc > 4) rc = oneway(e, atof(argv[3]), strtoul(argv[4], 0, 10));
        orb->destroy();
        if (rc == 0) printf("ok\n");
        return rc;
    } catch (CORBA::SystemException &ex) {
        printf("MISMATCH CORBA system exception %s\n", ex._name());
        return 1;
    } catch (CORBA::Exception &ex) {
        printf("MISMATCH CORBA exception %s\n", ex._name());
        return 1;
    }
}
